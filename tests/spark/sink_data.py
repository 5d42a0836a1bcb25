"""Test data for the Spark sink: source files, the table they aggregate into, and the
reference fold of every source row applied exactly once, in order."""

from __future__ import annotations

import json
import os
import random
import time

import pyarrow as pa

SCHEMA_DDL = "k long, v long, c string, s string, a long, l string"


def create_table(conn, name: str, buckets: int = 4) -> None:
    from aggfuncs import AggFunction

    _create(conn, name, buckets, [
        ("v", pa.int64(), AggFunction.SUM),
        ("c", pa.int64(), AggFunction.COUNT),
        ("s", pa.string(), AggFunction.STRING_AGG),
        ("a", pa.list_(pa.int64()), AggFunction.ARRAY_AGG),
        ("l", pa.string(), AggFunction.LAST_VALUE_IGNORE_NULLS)])


def _create(conn, name: str, buckets: int, columns) -> None:
    """An aggregation table keyed by `k` (int64) with (name, type, function) value columns."""
    from merge_engine import Schema, TableDescriptor

    builder = Schema.builder().column("k", pa.int64())
    for column, arrow_type, function in columns:
        builder = builder.agg_column(column, arrow_type, function)
    conn.admin.create_database(name.split(".")[0], ignore_if_exists=True)
    conn.admin.create_table(name, TableDescriptor(
        builder.primary_key("k").build(), bucket_count=buckets,
        properties={"table.merge-engine": "aggregation"}))


def filled_table(conn, database: str, schema, buckets: int, rows: list[dict],
                 name: str | None = None):
    """A new aggregation table of `schema` named `name` (default: a fresh name in `database`),
    holding `rows` (one flush): a handle on it."""
    import uuid

    import tally

    name = name or f"{database}.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_database(database, ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets, properties={"table.merge-engine": "aggregation"}))
    table = conn.table(name)
    if rows:
        with table.upsert_writer() as writer:
            writer.upsert(pa.Table.from_pylist(rows, schema=schema.to_arrow()))
    return table


def make_rows(count: int, keys: int, seed: int, start: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(start, start + count):
        rows.append({
            "k": rng.randrange(keys),
            "v": rng.randrange(-50, 100),
            "c": None if rng.random() < 0.2 else f"c{i}",
            "s": None if rng.random() < 0.2 else f"s{i}",
            "a": None if rng.random() < 0.2 else i,
            "l": None if rng.random() < 0.3 else f"l{i}",
        })
    return rows


def write_source_files(directory: str, files: int, rows_per_file: int, keys: int,
                       seed: int) -> list[list[dict]]:
    """One JSON-lines file per micro-batch, named so the file source lists them in order."""
    os.makedirs(directory, exist_ok=True)
    batches = []
    # The file source takes files oldest first: distinct modification times fix the batch order.
    first = time.time() - 10 * files
    for f in range(files):
        rows = make_rows(rows_per_file, keys, seed * 1000 + f, start=f * rows_per_file)
        path = os.path.join(directory, f"part-{f:04d}.json")
        with open(path, "w") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
        os.utime(path, (first + 10 * f, first + 10 * f))
        batches.append(rows)
    return batches


def expected(rows: list[dict], columns=("v", "c", "s", "a", "l")) -> dict:
    """{key: row} after folding `rows` in order into the table's functions (targets only)."""
    state: dict = {}
    for row in rows:
        cur = state.setdefault(row["k"], {"k": row["k"], "v": None, "c": 0, "s": None,
                                          "a": None, "l": None})
        if "v" in columns and row["v"] is not None:
            cur["v"] = row["v"] if cur["v"] is None else cur["v"] + row["v"]
        if "c" in columns and row["c"] is not None:
            cur["c"] += 1
        if "s" in columns and row["s"] is not None:
            cur["s"] = row["s"] if cur["s"] is None else cur["s"] + "," + row["s"]
        if "a" in columns and row["a"] is not None:
            cur["a"] = [row["a"]] if cur["a"] is None else cur["a"] + [row["a"]]
        if "l" in columns and row["l"] is not None:
            cur["l"] = row["l"]
    return state


def table_state(conn, name: str) -> dict:
    rows = conn.table(name).to_arrow().to_pylist()
    return {r["k"]: {"k": r["k"], **{c: r[c] for c in ("v", "c", "s", "a", "l")}} for r in rows}


def project(state: dict, columns) -> dict:
    return {k: {c: row[c] for c in ("k", *columns)} for k, row in state.items()}


# --- a decimal sum table, for one bad row that overflows in one bucket ----------------------

DECIMAL_DDL = "k long, v decimal(18,2)"
MAX_DECIMAL = "9999999999999999.99"  # the largest decimal(18, 2): any positive addend overflows


def create_decimal_table(conn, name: str, buckets: int = 4) -> None:
    from aggfuncs import AggFunction

    _create(conn, name, buckets, [("v", pa.decimal128(18, 2), AggFunction.SUM)])


def key_in_bucket(bucket: int, buckets: int = 4) -> int:
    """The smallest key the client's bucket function puts in `bucket`."""
    import numpy as np

    from tally.wire.bucket_hash import bucket_ids

    keys = np.arange(1000, dtype=np.int64)
    ids = bucket_ids(pa.table({"k": pa.array(keys)}), ["k"], buckets)
    return int(keys[ids == bucket][0])


def decimal_rows(keys: int, value: str, seed: int) -> list[tuple]:
    """(k, v) rows over keys 0..keys-1 (each key at least once), values around `value`."""
    from decimal import Decimal

    rng = random.Random(seed)
    rows = [(k, Decimal(value)) for k in range(keys)]
    rows += [(rng.randrange(keys), Decimal(value) + rng.randrange(100) / Decimal(100))
             for _ in range(keys)]
    rng.shuffle(rows)
    return rows


def decimal_sums(*row_lists) -> dict:
    """{k: sum of v} over every row of every list."""
    sums: dict = {}
    for rows in row_lists:
        for k, v in rows:
            sums[k] = sums.get(k, 0) + v
    return sums


def decimal_state(conn, name: str) -> dict:
    return {r["k"]: r["v"] for r in conn.table(name).to_arrow().to_pylist()}
