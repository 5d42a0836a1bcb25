"""Malformed data-plane requests for the fuzz test: DoPut writes, DoGet reads, binary lookups.

Each starts as a well-formed request for one real bucket of the fuzz table, sent to the server
hosting it, so the server's checks run all the way down to the tablet; then 1-3 breakages from
the lists below are applied, each of which alone makes the request invalid (see
tests/reliability/flight_requests.py for the rules). Base writes target every column but
`label`, which the fuzz owner holds a column lock on, so a valid write would pass the lock check
and a broken one is refused for what was broken.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from tally.wire.messages import frame
from tests.reliability.flight_requests import (MERGE_MODES, OVERSIZE, WRONG_TYPE, Context,
                                               Request, dicts, dumps, lists, not_a_json_object,
                                               texts)

VALUE_TARGETS = ["k", "region", "total", "peak", "hits"]
COLUMNS = {"k", "region", "total", "peak", "hits", "label"}
HEADER_FIELDS = ["op", "table_id", "partition_id", "bucket"]


def _uncastable(n: int):
    """Arrays no Arrow safe cast turns into int64 or float64."""
    return st.sampled_from([
        pa.array([f"z{i}" for i in range(n)]),
        pa.array([[i] for i in range(n)], pa.list_(pa.int64())),
        pa.array([{"a": i} for i in range(n)]),
        pa.array([b"\xff" * (i + 1) for i in range(n)], pa.binary()),
    ])


def _set(rows: pa.Table, name: str, values) -> pa.Table:
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    if name in rows.column_names:
        return rows.set_column(rows.column_names.index(name), name, array)
    return rows.append_column(name, array)


@st.composite
def base_rows(draw, ctx: Context, bucket, keys_only: bool) -> pa.Table:
    keys = draw(st.lists(st.sampled_from(bucket.keys), min_size=1, max_size=4))
    n = len(keys)
    data = {"k": pa.array(keys, pa.int64()), "region": pa.array([bucket.partition] * n)}
    if not keys_only:
        data["total"] = pa.array(draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)),
                                 pa.int64())
        data["peak"] = pa.array(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)))
        data["hits"] = pa.array([1] * n, pa.int64())
    return pa.table(data)


KEY_BREAKAGES = ["wrong bucket", "wrong partition", "null key", "missing key column",
                 "unknown column", "uncastable key"]


@st.composite
def break_rows(draw, ctx: Context, bucket, rows: pa.Table, op: str, header: dict,
               why: list[str]) -> pa.Table:
    """One breakage of the rows (or of the targets that go with them); op "lookup" breaks a
    lookup key."""
    n = rows.num_rows
    ways = KEY_BREAKAGES + {"put": ["uncastable value", "label without its lock"],
                            "delete": ["label without its lock"], "lookup": []}[op]
    way = draw(st.sampled_from(ways))
    why.append(way)
    if way == "wrong bucket":
        others = [k for b in ctx.buckets if b.partition == bucket.partition
                  and b.bucket != bucket.bucket for k in b.keys]
        i = draw(st.integers(0, n - 1))
        keys = rows.column("k").to_pylist()
        keys[i] = draw(st.sampled_from(others))
        return _set(rows, "k", pa.array(keys, pa.int64()))
    if way == "wrong partition":
        other = next(b.partition for b in ctx.buckets if b.partition != bucket.partition)
        regions = rows.column("region").to_pylist()
        regions[draw(st.integers(0, n - 1))] = other
        return _set(rows, "region", regions)
    if way == "null key":
        keys = rows.column("k").to_pylist()
        keys[draw(st.integers(0, n - 1))] = None
        return _set(rows, "k", pa.array(keys, pa.int64()))
    if way == "missing key column":
        return rows.drop_columns([draw(st.sampled_from(["k", "region"]))])
    if way == "unknown column":
        name = draw(texts.filter(lambda s: s not in COLUMNS))
        return rows.append_column(name, pa.array(range(n)))
    if way == "uncastable key":
        return _set(rows, "k", draw(_uncastable(n)))
    if way == "uncastable value":
        return _set(rows, draw(st.sampled_from(["total", "peak"])), draw(_uncastable(n)))
    # label without its lock: the fuzz owner holds `label`; no lease (or someone else's)
    header["target_columns"] = (header.get("target_columns") or VALUE_TARGETS) + ["label"]
    return rows if op == "delete" else _set(rows, "label", draw(st.lists(
        texts, min_size=n, max_size=n)))


@st.composite
def break_header(draw, ctx: Context, header: dict, why: list[str], call: str) -> None:
    """One breakage (in place) of the header of a "write", "read" or "lookup"."""
    ways = ["drop field", "wrong type", "unknown table id", "unknown partition id",
            "bucket out of range"] + ([] if call == "lookup" else ["bad op"])
    fields = HEADER_FIELDS[1:] if call == "lookup" else HEADER_FIELDS
    if call == "write":
        ways += ["bad mode", "bad target columns", "bad writer", "bad lease"]
        fields = fields + ["mode", "target_columns", "writer", "lease"]
    elif header.get("op") == "changelog":
        ways += ["range out of bounds"]
        fields = fields + ["start", "end"]
    way = draw(st.sampled_from(ways))
    why.append(way)
    if way == "drop field":
        header.pop(draw(st.sampled_from(HEADER_FIELDS if call != "lookup" else fields)), None)
    elif way == "wrong type":
        field = draw(st.sampled_from(fields))
        kind = {"op": "str", "mode": "str", "target_columns": "list", "writer": "list",
                "lease": "obj"}.get(field, "int")
        optional = field in ("end", "target_columns", "writer", "lease")
        value = draw(WRONG_TYPE[kind].filter(lambda v: not (optional and v is None)).filter(
            lambda v: not (field == "mode" and isinstance(v, int) and not isinstance(v, bool))))
        header[field] = value
        why[-1] += f" ({field})"
    elif way == "bad op":
        header["op"] = draw(texts.filter(lambda s: s not in ("put", "delete", "undo",
                                                             "scan", "changelog")))
    elif way == "unknown table id":
        header["table_id"] = draw(st.integers(10**6, 2**62))
    elif way == "unknown partition id":
        header["partition_id"] = draw(st.one_of(st.integers(10**6, 2**62),
                                                st.integers(-2**62, -1)))
    elif way == "bucket out of range":
        header["bucket"] = draw(st.one_of(st.integers(4, 2**62), st.integers(-2**62, -1)))
    elif way == "bad mode":
        header["mode"] = draw(texts.filter(
            lambda s: s.strip().replace("-", "_").upper() not in MERGE_MODES))
    elif way == "bad target columns":
        header["target_columns"] = draw(st.one_of(
            st.lists(texts.filter(lambda s: s not in COLUMNS), min_size=1, max_size=3).map(
                lambda extra: VALUE_TARGETS + extra),
            st.just(["total", "peak"]), st.just([]), st.lists(st.integers(), min_size=1)))
    elif way == "bad writer":
        header["writer"] = draw(st.one_of(
            st.lists(texts, min_size=1, max_size=1),
            st.tuples(texts, st.integers(), texts).map(list),
            st.tuples(texts, st.integers(2**63, 2**80)).map(list),
            st.tuples(st.integers(), st.integers()).map(list),
            st.tuples(texts, st.one_of(texts, st.floats(), st.booleans(), st.none(), lists,
                                       dicts)).map(list)))
    elif way == "bad lease":
        header["lease"] = {"owner_id": draw(st.one_of(st.just(ctx.owner), texts)),
                           "token": draw(st.integers(-2**62, 2**62).filter(
                               lambda t: t != ctx.lease["token"]))}
    else:  # range out of bounds
        start, end = draw(st.one_of(
            st.tuples(st.integers(-2**62, -1), st.none()),
            st.tuples(st.integers(1, 2**40), st.integers(0, 2**40)).filter(lambda r: r[0] > r[1]),
            st.tuples(st.just(0), st.integers(10**9, 2**62))))
        header["start"], header["end"] = start, end


def _other_address(draw, ctx: Context, bucket) -> str:
    return draw(st.sampled_from([a for a in ctx.tablets + [ctx.coordinator]
                                 if a != bucket.address]))


@st.composite
def put_requests(draw, ctx: Context) -> Request:
    bucket = draw(st.sampled_from(ctx.buckets))
    op = draw(st.sampled_from(["put", "put", "delete"]))
    header = {**ctx.header(bucket, op), "mode": "AGGREGATE",
              "target_columns": VALUE_TARGETS if op == "put" else ["k", "region", "total"],
              "writer": [f"fuzz-{draw(st.integers(0, 10**9))}", draw(st.integers(1, 2**62))]}
    rows = draw(base_rows(ctx, bucket, keys_only=op == "delete"))
    why: list[str] = []
    address = bucket.address
    ways = draw(st.lists(st.sampled_from(["rows", "header", "descriptor", "server",
                                          "oversized"]), min_size=1, max_size=3, unique=True))
    for way in sorted(ways, key=lambda w: w == "oversized"):  # grow the rows last
        if way == "rows":
            rows = draw(break_rows(ctx, bucket, rows, op, header, why))
        elif way == "header":
            draw(break_header(ctx, header, why, "write"))
        elif way == "server":
            address = _other_address(draw, ctx, bucket)
            why.append("sent to a server that does not host the bucket")
        elif way == "oversized":
            per_row = max(1, rows.nbytes // max(1, rows.num_rows))
            rows = rows.take(np.arange(OVERSIZE // per_row + 1) % rows.num_rows)
            why.append(f"oversized ({rows.nbytes:,} bytes)")
    body = dumps(header)
    if "descriptor" in ways:
        body = draw(not_a_json_object)
        why.append("descriptor is not a JSON object")
    return Request(address, "put", "", body, rows, why)


@st.composite
def get_requests(draw, ctx: Context) -> Request:
    bucket = draw(st.sampled_from(ctx.buckets))
    header = ctx.header(bucket, draw(st.sampled_from(["scan", "changelog"])))
    why: list[str] = []
    address = bucket.address
    way = draw(st.sampled_from(["header", "header", "server", "garbage", "garbage payload"]))
    if way == "server":
        address = _other_address(draw, ctx, bucket)
        why.append("sent to a server that does not host the bucket")
        if draw(st.booleans()):
            draw(break_header(ctx, header, why, "read"))
    elif way == "header":
        for _ in range(draw(st.integers(1, 2))):
            draw(break_header(ctx, header, why, "read"))
    if way == "garbage":
        return Request(address, "get", "", draw(not_a_json_object), None, ["garbage ticket"])
    body = dumps(header)
    if way == "garbage payload":
        body += b"\n" + draw(st.binary(max_size=64))
        why.append("garbage after the header")
    return Request(address, "get", "", body, None, why)


@st.composite
def lookup_requests(draw, ctx: Context) -> Request:
    bucket = draw(st.sampled_from(ctx.buckets))
    header = ctx.header(bucket, "lookup")
    del header["op"]
    key = pa.table({"k": pa.array([draw(st.sampled_from(bucket.keys))], pa.int64()),
                    "region": [bucket.partition]})
    why: list[str] = []
    address = bucket.address
    way = draw(st.sampled_from(["header", "key", "key count", "server", "garbage",
                                "no key", "garbage key"]))
    if way == "header":
        draw(break_header(ctx, header, why, "lookup"))
    elif way == "key":
        key = draw(break_rows(ctx, bucket, key, "lookup", {}, why))
    elif way == "key count":
        count = draw(st.sampled_from([0, 2, 3]))
        key = pa.concat_tables([key] * count) if count else key.slice(0, 0)
        why.append(f"{key.num_rows} keys")
    elif way == "server":
        address = _other_address(draw, ctx, bucket)
        why.append("sent to a server that does not host the bucket")
    if way == "garbage":
        return Request(address, "action", "lookup", draw(not_a_json_object), None,
                       ["garbage body"])
    if way == "no key":
        return Request(address, "action", "lookup", dumps(header), None, ["no key"])
    body = frame(header, key)
    if way == "garbage key":
        body = dumps(header) + b"\n" + draw(st.binary(max_size=64))
        why.append("garbage key")
    return Request(address, "action", "lookup", body, None, why)
