"""A deterministic aggregation workload and its reference fold, shared by the cluster tests
and the reliability suite (tests/reliability).

The table: key `k` (BIGINT) and partition `region` (STRING, part of the key), then
`total` SUM BIGINT, `peak` MAX DOUBLE, `hits` COUNT, `label` LAST_VALUE_IGNORE_NULLS STRING.
The reference fold is plain Python written from the function definitions, independent of the
engine. `steps` mixes in full-row deletes (for tables with `table.delete.behavior = allow`), so
that changelogs also carry `-D` records.
"""

from __future__ import annotations

import random

import pyarrow as pa

REGIONS = ["eu", "us"]


def descriptor(buckets: int = 4, partitioned: bool = True, **properties):
    from aggfuncs import AggFunction
    from merge_engine import Schema, TableDescriptor

    builder = (Schema.builder().column("k", pa.int64()).column("region", pa.string())
               .agg_column("total", pa.int64(), AggFunction.SUM)
               .agg_column("peak", pa.float64(), AggFunction.MAX)
               .agg_column("hits", pa.int64(), AggFunction.COUNT)
               .agg_column("label", pa.string(), AggFunction.LAST_VALUE_IGNORE_NULLS)
               .primary_key("k", "region"))
    if partitioned:
        builder = builder.partition_key("region")
    props = {"table.merge-engine": "aggregation", **properties}
    return TableDescriptor(builder.build(), bucket_count=buckets, properties=props)


def batches(seed: int, count: int, rows: int, keys: int = 200) -> list[pa.Table]:
    """`count` Arrow batches of `rows` rows over `keys` keys per region."""
    rng = random.Random(seed)
    out = []
    for b in range(count):
        data = {"k": [], "region": [], "total": [], "peak": [], "hits": [], "label": []}
        for _ in range(rows):
            data["k"].append(rng.randrange(keys))
            data["region"].append(rng.choice(REGIONS))
            data["total"].append(rng.randrange(-1000, 1000))
            data["peak"].append(rng.random() * 100 if rng.random() < 0.9 else None)
            data["hits"].append(1 if rng.random() < 0.8 else None)
            data["label"].append(f"s{seed}-b{b}" if rng.random() < 0.5 else None)
        out.append(pa.table(data, schema=pa.schema([
            ("k", pa.int64()), ("region", pa.string()), ("total", pa.int64()),
            ("peak", pa.float64()), ("hits", pa.int64()), ("label", pa.string())])))
    return out


KEY_SCHEMA = pa.schema([("k", pa.int64()), ("region", pa.string())])


def steps(seed: int, count: int, rows: int, keys: int = 200,
          delete_share: float = 0.0) -> list[tuple[str, pa.Table]]:
    """`count` writes ("put", batch) or ("delete", keys): the puts are `batches(seed, ...)`, and
    each step is instead a delete of `rows // 10` random keys with probability `delete_share`."""
    rng = random.Random(seed * 7919 + 1)
    out = []
    for batch in batches(seed, count, rows, keys):
        if rng.random() < delete_share:
            n = max(1, rows // 10)
            out.append(("delete", pa.table({"k": [rng.randrange(keys) for _ in range(n)],
                                            "region": [rng.choice(REGIONS) for _ in range(n)]},
                                           schema=KEY_SCHEMA)))
        else:
            out.append(("put", batch))
    return out


def fold(tables: list[pa.Table]) -> dict[tuple, dict]:
    """{(k, region): row} after applying the rows in order with the table's functions."""
    return fold_steps([("put", t) for t in tables])


def fold_steps(writes: list[tuple[str, pa.Table]]) -> dict[tuple, dict]:
    """The fold of `steps` output: puts merge with the table's functions, deletes remove keys."""
    state: dict[tuple, dict] = {}
    for op, table in writes:
        if op == "delete":
            for r in table.to_pylist():
                state.pop((r["k"], r["region"]), None)
            continue
        for r in table.to_pylist():
            key = (r["k"], r["region"])
            s = state.setdefault(key, {"k": r["k"], "region": r["region"], "total": None,
                                       "peak": None, "hits": 0, "label": None})
            if r["total"] is not None:
                s["total"] = r["total"] if s["total"] is None else s["total"] + r["total"]
            if r["peak"] is not None:
                s["peak"] = r["peak"] if s["peak"] is None else max(s["peak"], r["peak"])
            if r["hits"] is not None:
                s["hits"] += 1
            if r["label"] is not None:
                s["label"] = r["label"]
    return state


def as_state(table: pa.Table) -> dict[tuple, dict]:
    return {(r["k"], r["region"]): r for r in table.to_pylist()}
