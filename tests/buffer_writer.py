"""The table, the workload and the crashing writer process of tests/test_tablet_buffer.py.

Run as `python -m tests.buffer_writer PATH PROPERTIES_JSON SEED STEP [STEP ...]`: opens the tablet
at PATH with the table below and PROPERTIES_JSON merged into its properties, runs the steps in
order, then ends with `os._exit(0)`: no close(), no flush(), so whatever the tablet only held in
its row buffer survives solely as changelog records. Steps:

  write:FIRST:COUNT   apply operations FIRST .. FIRST+COUNT-1 of `operations(SEED, ...)`
  flush               flush()
  truncate            truncate_log(log_end_offset)
  retain              enforce_retention(tablet)  (merge_engine/kv/log_retention.py)
  batch-rows:N        flushes write N rows per RocksDB write batch (many batches per flush)
  persist-from:N      RocksDB's memtables are flushed to table files once the changelog
                      reaches four buffers of at least N bytes (0: with every buffer-size
                      flush's worth of changelog, so flushed rows survive the crash)
  die:N               end with os._exit(0) right after the N-th RocksDB commit from here on:
                      a crash at a chosen point of a write (after its changelog, between
                      the batches of a flush); rows only in RocksDB's memtables are lost
  die-persisted:N     the same, RocksDB's memtables flushed to table files just before (as
                      RocksDB does when one fills up): a flush cut short leaves its rows
  follow:SOURCE:BYTES as a follower, apply the changelog entries of the bucket at SOURCE
                      (closed, of the same table) from this one's log end until caught up,
                      BYTES of entries per apply_replicated
  tail:OFFSET         truncate_tail(OFFSET)

Protocol on stdout, one flushed line per event:
  ready <log_start_offset> <log_end_offset>
  ack <index> <offset>            operation <index> returned <offset>
  error <index> <class>           operation <index> raised a TallyError of <class>
  flushed <log_end_offset>
  truncated <log_start_offset>
  retained <log_start_offset>
  followed <log_end_offset>       after each apply_replicated of a follow step
  cut <log_end_offset>
  exit <log_end_offset>           just before os._exit(0)
  died                            just before the os._exit(0) of a die:N step

The operations are a pure function of (seed, index), so the parent test regenerates them and
feeds a ReferenceTable (merge_engine.testing) the same writes.
"""

from __future__ import annotations

import json
import os
import random
import sys
from decimal import Decimal

import pyarrow as pa

from aggfuncs import AggFunction
from merge_engine.testing import ColumnSpec, Delete, Put, TableSpec

KEY = ("region", "id")
REGIONS = ("", "a\x00b", "eu", "us")  # escaped string keys: empty, with a NUL byte, plain
IDS = 15  # 60 keys in all: writes keep hitting buffered rows, deletes find something
VALUE_COLUMNS = ("qty", "amount", "peak", "tags", "status", "first")
COLUMNS = (
    ColumnSpec("region", pa.string(), nullable=False),
    ColumnSpec("id", pa.int32(), nullable=False),
    ColumnSpec("qty", pa.int64(), AggFunction.SUM),
    ColumnSpec("amount", pa.decimal128(12, 2), AggFunction.SUM),
    ColumnSpec("peak", pa.float64(), AggFunction.MAX),
    ColumnSpec("tags", pa.string(), AggFunction.STRING_AGG, {"delimiter": ";"}),
    ColumnSpec("status", pa.string(), AggFunction.LAST_VALUE_IGNORE_NULLS),
    # first_value keeps the first *written* value, null included: a replay that lost the
    # written bits would let a later write replace a written null
    ColumnSpec("first", pa.string(), AggFunction.FIRST_VALUE),
)
BASE_PROPERTIES = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
RETRACTABLE = ("qty", "amount", "tags")  # sum and string_agg retract; max and first_value cannot
WRITER_ID = "buffer-writer"


def spec(properties: dict | None = None) -> TableSpec:
    return TableSpec(COLUMNS, KEY, {**BASE_PROPERTIES, **(properties or {})})


def descriptor(properties: dict | None = None):
    return spec(properties).descriptor()


def all_keys() -> list[dict]:
    return [{"region": r, "id": i} for r in REGIONS for i in range(IDS)]


def _key(rnd: random.Random) -> dict:
    return {"region": rnd.choice(REGIONS), "id": rnd.randrange(IDS)}


def _value(rnd: random.Random, column: str):
    if column == "qty":
        return None if rnd.random() < 0.1 else rnd.randint(-50, 100)
    if column == "amount":
        return None if rnd.random() < 0.2 else Decimal(rnd.randint(-10_000, 10_000)).scaleb(-2)
    if column == "peak":
        return None if rnd.random() < 0.2 else rnd.choice([0.0, -0.0, round(rnd.random() * 100, 2)])
    if column == "tags":
        return None if rnd.random() < 0.7 else rnd.choice(["a", "b", "cc", ""])
    if column == "status":
        return None if rnd.random() < 0.3 else rnd.choice(["new", "paid", "sent"])
    return None if rnd.random() < 0.4 else rnd.choice(["p", "q", "r"])  # first


def _retraction_row(rnd: random.Random, targets: tuple) -> dict:
    row = {**_key(rnd), "_change_type": rnd.choice(["+I", "-U", "-D", "+U"])}
    row.update({c: _value(rnd, c) for c in targets if c not in KEY})
    if row["_change_type"] in ("-U", "-D") and row.get("tags"):
        row["tags"] = rnd.choice(["a", "b"])  # a token that is often there to take back
    return row


def operation(seed: int, index: int, retractions: bool = False, big_rows: int = 300):
    """Operation `index` of the workload `seed`: a Put or a Delete (merge_engine.testing.ops).

    Full and partial puts (dicts or Arrow), now and then a big put of `big_rows` rows, full and
    partial deletes, writes with a writer id (and retries of them), an overflowing put that must
    be rejected without a trace, and with `retractions` puts that retract sums and tags (which
    the reference model does not know, so only tablets are compared with each other then).
    """
    rnd = random.Random(f"{seed}/{index}")
    writer = (WRITER_ID, index) if rnd.random() < 0.2 else None
    pick = rnd.random()
    if pick < 0.12:
        keys = tuple(_key(rnd) for _ in range(rnd.randint(1, 3)))
        return Delete(keys, writer=writer)
    if pick < 0.20:
        keys = tuple(_key(rnd) for _ in range(rnd.randint(1, 3)))
        targets = KEY + tuple(rnd.sample(VALUE_COLUMNS, rnd.randint(1, 3)))
        return Delete(keys, target_columns=targets, writer=writer)
    if pick < 0.23 and index > 0:
        # a retry: the same writer sequence again, answered with the recorded offset
        earlier = rnd.randrange(index)
        return Put(({**_key(rnd), "qty": 1},), writer=(WRITER_ID, earlier))
    if pick < 0.25:
        big = 2**62  # each row fits int64, their sum does not: AggregateOverflowError
        key = _key(rnd)
        return Put(({**key, "qty": big}, {**_key(rnd), "qty": 1}, {**key, "qty": big}),
                   target_columns=KEY + ("qty",))
    if retractions and pick < 0.35:
        targets = KEY + tuple(c for c in RETRACTABLE if rnd.random() < 0.7)
        rows = tuple(_retraction_row(rnd, targets) for _ in range(rnd.randint(1, 4)))
        return Put(rows, target_columns=targets)
    targets = None
    if pick < 0.50:
        targets = KEY + tuple(rnd.sample(VALUE_COLUMNS, rnd.randint(1, 4)))
    count = big_rows if rnd.random() < 0.06 else rnd.randint(1, 8)
    columns = targets or KEY + VALUE_COLUMNS
    rows = []
    for _ in range(count):
        row = _key(rnd)
        # big puts leave tags null (a missing target reads as null): string_agg grows fast
        row.update({c: _value(rnd, c) for c in columns
                    if c not in KEY and not (count > 8 and c == "tags")})
        rows.append(row)
    return Put(tuple(rows), target_columns=targets, writer=writer, arrow=rnd.random() < 0.5)


def apply(table, op, table_spec: TableSpec | None = None) -> int:
    """Run `op` against a KvTablet (`table_spec` given: Arrow input where the op asks for it)
    or a ReferenceTable (`table_spec` None)."""
    if table_spec is None:
        return op.apply(table)
    from merge_engine.testing.ops import engine_mode

    if isinstance(op, Put) and op.arrow:
        rows = table_spec.arrow_rows([dict(r) for r in op.rows], op.target_columns)
        return table.put(rows, mode=engine_mode(op.mode),
                         target_columns=None if op.target_columns is None else list(op.target_columns),
                         writer=op.writer)
    return op.apply(table, engine_mode(op.mode))


def die_after_commits(tablet, count: int, persisted: bool = False) -> None:
    """Make the tablet's store end the process right after its `count`-th commit from now
    (of the changelog's, logged, or of rows, without RocksDB's write-ahead log); `persisted`:
    with RocksDB's memtables flushed to table files first, as RocksDB does on its own when
    one fills up, so rows of a flush cut short survive the crash."""
    store, left = tablet._store, [count]

    def then_die(commit):
        def commit_then_die(batch) -> None:
            commit(batch)
            left[0] -= 1
            if left[0] == 0:
                if persisted:
                    store.db.flush(True)
                print("died", flush=True)
                os._exit(0)
        return commit_then_die

    store.commit, store.commit_rows = then_die(store.commit), then_die(store.commit_rows)


def follow(tablet, source, max_bytes: int) -> None:
    """Copy `source`'s changelog entries into `tablet` (a follower) until it has them all."""
    while entries := source.replication_entries(tablet.log_end_offset, max_bytes):
        print(f"followed {tablet.apply_replicated(entries)}", flush=True)


def main(argv: list[str]) -> None:
    from merge_engine.kv.log_retention import enforce_retention
    from merge_engine.kv.tablet import KvTablet
    from tally.errors import TallyError

    path, properties, seed, steps = argv[0], json.loads(argv[1]), int(argv[2]), argv[3:]
    table_spec = spec(properties)
    tablet = KvTablet.open(path, table_spec.descriptor())
    print(f"ready {tablet.log_start_offset} {tablet.log_end_offset}", flush=True)
    for step in steps:
        if step.startswith("write:"):
            _, first, count = step.split(":")
            for index in range(int(first), int(first) + int(count)):
                try:
                    offset = apply(tablet, operation(seed, index), table_spec)
                except TallyError as exc:
                    print(f"error {index} {type(exc).__name__}", flush=True)
                else:
                    print(f"ack {index} {offset}", flush=True)
        elif step == "flush":
            tablet.flush()
            print(f"flushed {tablet.log_end_offset}", flush=True)
        elif step == "truncate":
            print(f"truncated {tablet.truncate_log(tablet.log_end_offset)}", flush=True)
        elif step == "retain":
            print(f"retained {enforce_retention(tablet)}", flush=True)
        elif step.startswith("follow:"):
            _, source_path, max_bytes = step.rsplit(":", 2)
            follow(tablet, KvTablet.open(source_path, table_spec.descriptor()), int(max_bytes))
        elif step.startswith("tail:"):
            print(f"cut {tablet.truncate_tail(int(step.split(':')[1]))}", flush=True)
        elif step.startswith("batch-rows:"):
            tablet._rows.batch_rows = int(step.split(":")[1])
        elif step.startswith("persist-from:"):
            tablet._rows.persist_from = int(step.split(":")[1])
        elif step.startswith("die:") or step.startswith("die-persisted:"):
            kind, count = step.split(":")
            die_after_commits(tablet, int(count), persisted=kind == "die-persisted")
        else:
            raise SystemExit(f"unknown step {step!r}")
    print(f"exit {tablet.log_end_offset}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # a crash as far as the tablet can tell: nothing is closed or flushed


if __name__ == "__main__":
    main(sys.argv[1:])
