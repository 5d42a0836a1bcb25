"""Point lookups answered as visible row bytes, through real tablet servers.

A table of many column types and aggregate functions (sums, max of every ordered type, a
token-keeping string_agg, sequenced-free last values, sketches and bitmaps as binary states,
nulls) answers `lookup` exactly what `lookup_many` and a scan (both still Arrow) give, the
same before and after its rows reach RocksDB; a table with a nested column keeps the Arrow
answer and answers the same. A request of another wire version is a WireVersionError, a
malformed one an InvalidInputError, and nothing is read.
"""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pytest

import tally
from aggfuncs import build_bitmap, build_sketch
from tally.errors import InvalidInputError, WireVersionError
from tally.wire.lookup_answer import LOOKUP_VERSION
from tally.wire.messages import frame
from tally.wire.point_keys import CANONICAL_HEAD, CANONICAL_MARK, VERSION_FIELD
from tests.cluster.conftest import private_cluster

F = tally.AggFunction
COLUMNS = [  # name, type, function (None: last_value), params
    ("i8", pa.int8(), F.SUM, {}), ("u16", pa.uint16(), F.MAX, {}),
    ("i32", pa.int32(), F.MIN, {}), ("u64", pa.uint64(), None, {}),
    ("f32", pa.float32(), F.MAX, {}), ("f64", pa.float64(), F.SUM, {}),
    ("dec", pa.decimal128(12, 3), F.SUM, {}), ("s", pa.string(), F.MAX, {}),
    ("ls", pa.large_string(), None, {}), ("b", pa.binary(), F.MIN, {}),
    ("d", pa.date32(), F.MAX, {}), ("t", pa.time64("us"), None, {}),
    ("ts", pa.timestamp("us"), F.MAX, {}), ("tz", pa.timestamp("ms", "Europe/Paris"), None, {}),
    ("ok", pa.bool_(), F.BOOL_AND, {}), ("tags", pa.string(), F.STRING_AGG, {"delimiter": "::"}),
    ("hll", pa.binary(), F.HLL_SKETCH, {}), ("ids", pa.binary(), F.RBM32, {}),
    ("n", pa.int64(), F.COUNT, {}),
]


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    with private_cluster(tmp_path_factory, "answers") as (_, connection):
        yield connection


def _table(conn, name: str, nested: bool = False):
    builder = tally.Schema.builder().column("k", pa.int64(), nullable=False)
    for column, arrow_type, function, params in COLUMNS:
        builder = builder.agg_column(column, arrow_type, function or F.LAST_VALUE, **params)
    if nested:
        builder = builder.agg_column("many", pa.list_(pa.int64()), F.ARRAY_AGG)
    conn.admin.create_table(name, tally.TableDescriptor(
        builder.primary_key("k").build(), bucket_count=2,
        properties={"table.merge-engine": "aggregation"}))
    return conn.table(name)


def _rows(keys: range, nested: bool) -> list[dict]:
    rows = []
    for k in keys:
        odd = k % 2 == 1
        row = {
            "k": k, "i8": k % 100 - 50, "u16": k * 7 % 65_000, "i32": -k, "u64": 2**64 - 1 - k,
            "f32": k / 3, "f64": -0.0 if k == 0 else k * 1.5, "dec": decimal.Decimal(k) / 8,
            "s": f"é{k}\U0001F600", "ls": "x" * (k % 5), "b": bytes([k % 256, 0]),
            "d": datetime.date(2026, 1, 1) + datetime.timedelta(days=k),
            "t": datetime.time(k % 24, 5, 6, 789), "ts": datetime.datetime(2026, 5, 1, 3, 4, k % 60),
            "tz": datetime.datetime(2026, 3, 29, 0, 30, tzinfo=datetime.timezone.utc)
            + datetime.timedelta(hours=k), "ok": k % 3 != 0, "tags": f"a{k}::b",
            "hll": build_sketch(F.HLL_SKETCH, [k, k + 1]), "ids": build_bitmap([k, 7]), "n": k,
        }
        if odd:  # nulls in every column but the key on odd keys
            row.update({c: None for c, *_ in COLUMNS if c not in ("n",)})
        if nested:
            row["many"] = None if odd else [k, -k]
        rows.append(row)
    return rows


def _same(a, b) -> bool:
    return repr(a) == repr(b)  # -0.0, decimals' scale and zones count


@pytest.mark.parametrize("nested", [False, True], ids=["visible-rows", "nested-arrow"])
def test_lookups_answer_what_lookup_many_and_scans_give(conn, nested):
    table = _table(conn, f"answers.many_types_{int(nested)}", nested)
    keys = range(40)
    with table.upsert_writer() as writer:
        writer.upsert(_rows(keys, nested))
        writer.upsert(_rows(range(0, 40, 4), nested))  # merged once more: sums, sketches, tags
        writer.flush()

    def check():
        scanned = {r["k"]: r for r in table.to_arrow().to_pylist()}
        many = table.lookup_many([{"k": k} for k in [*keys, 100_000]])
        assert many[-1] is None and table.lookup({"k": 100_000}) is None
        for k, row in zip(keys, many):
            found = table.lookup({"k": k})
            assert _same(found, row) and _same(found, scanned[k]), (k, found, row)

    check()
    with table.upsert_writer() as writer:  # enough rows to push the buffer to RocksDB
        writer.upsert(_rows(range(1000, 9000), nested))
        writer.flush()
    check()


def test_requests_of_another_version_are_refused(conn):
    table = _table(conn, "answers.versions")
    with table.upsert_writer() as writer:
        writer.upsert(_rows(range(4), False))
        writer.flush()
    meta = table.meta
    partition, bucket, key = meta.point_keys.prepare({"k": 2})
    route = conn.route(table.name, partition, bucket, table.table_id)
    server = conn.server(route.address)
    answers = meta.point_keys.answers
    good = CANONICAL_HEAD.pack(CANONICAL_MARK, LOOKUP_VERSION, route.table_id,
                               route.partition_id, route.bucket)
    assert answers.row(server.lookup(good + key))["i32"] == -2
    older = CANONICAL_HEAD.pack(CANONICAL_MARK, LOOKUP_VERSION - 1, route.table_id,
                                route.partition_id, route.bucket)
    with pytest.raises(WireVersionError, match=f"wire version {LOOKUP_VERSION - 1}"):
        server.lookup(older + key)
    before = b"\x00TLK" + good[5:]  # the unversioned head of before
    with pytest.raises(WireVersionError, match="another version"):
        server.lookup(before + key)
    arrow_key = pa.table({"k": pa.array([2], pa.int64())})
    with pytest.raises(WireVersionError, match="wire version None"):
        server.lookup(frame(route.header(), arrow_key))
    assert answers.row(server.lookup(frame({**route.header(), VERSION_FIELD: LOOKUP_VERSION},
                                           arrow_key)))["i32"] == -2
    with pytest.raises(InvalidInputError, match="ends inside its head"):
        server.lookup(good[:-3])
    with pytest.raises(InvalidInputError):
        server.lookup(json.dumps({**route.header(), VERSION_FIELD: LOOKUP_VERSION}).encode()
                      + b"\nnot arrow")
