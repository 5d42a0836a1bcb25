"""Point lookups and lookup_many over a LocalCluster, against a plain-Python model of the table.

Every key type a table may have (integers, text, binary, dates, timestamps, decimals, composite
keys, partitioned tables) is written, overwritten with nulls in its value columns and deleted,
and every key (written or not) is then looked up one at a time and all at once: both must
answer exactly what the model holds. A small memory budget keeps row buffers flushing, so rows
are read from the buffer and from RocksDB alike. Then bad keys: each refused with an
InvalidInputError naming the column, on the client and, for requests a client would not send,
on the server, with nothing read.
"""

from __future__ import annotations

import datetime
import decimal
import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tally
from tally.errors import InvalidInputError
from tally.wire.messages import dumps, frame
from tally.wire.lookup_answer import LOOKUP_VERSION
from tally.wire.point_keys import CANONICAL_HEAD, CANONICAL_MARK, VERSION_FIELD, PointKeys
from tests.cluster.conftest import private_cluster

_names = itertools.count()

# key kind -> (key columns as (name, type, values strategy), partition key)
KINDS = {
    "int64": ([("k", pa.int64(), st.integers(-2**63, 2**63 - 1))], ()),
    "int8": ([("k", pa.int8(), st.integers(-128, 127))], ()),
    "text": ([("k", pa.string(), st.text(max_size=6))], ()),
    "binary": ([("k", pa.binary(), st.binary(max_size=6))], ()),
    "date": ([("k", pa.date32(), st.dates(datetime.date(1900, 1, 1),
                                          datetime.date(2200, 1, 1)))], ()),
    "timestamp": ([("k", pa.timestamp("us"), st.datetimes(datetime.datetime(1970, 1, 1),
                                                          datetime.datetime(2100, 1, 1)))], ()),
    "decimal": ([("k", pa.decimal128(9, 2), st.decimals(-10**6, 10**6, places=2,
                                                       allow_nan=False))], ()),
    "composite": ([("a", pa.string(), st.sampled_from(["", "x", "x\x00", "yy"])),
                   ("b", pa.int32(), st.integers(-3, 3)),
                   ("c", pa.date32(), st.sampled_from([datetime.date(2026, 1, d)
                                                       for d in (1, 2)]))], ()),
    "partitioned": ([("day", pa.string(), st.sampled_from(["d1", "d2", "d3"])),
                     ("k", pa.int64(), st.integers(0, 40))], ("day",)),
}


@pytest.fixture(scope="module")
def lookups_cluster_and_conn(tmp_path_factory):
    with private_cluster(tmp_path_factory, "lookups") as both:
        yield both


@pytest.fixture(scope="module")
def lookups_cluster(lookups_cluster_and_conn):
    return lookups_cluster_and_conn[0]


@pytest.fixture(scope="module")
def conn(lookups_cluster_and_conn):
    return lookups_cluster_and_conn[1]


def new_table(conn, kind: str, buckets: int = 3):
    columns, partition_key = KINDS[kind]
    builder = tally.Schema.builder()
    for name, arrow_type, _ in columns:
        builder = builder.column(name, arrow_type)
    builder = (builder.agg_column("v", pa.int64(), tally.AggFunction.LAST_VALUE)
               .agg_column("s", pa.string(), tally.AggFunction.LAST_VALUE)
               .primary_key(*[c[0] for c in columns]))
    if partition_key:
        builder = builder.partition_key(*partition_key)
    name = f"lookups.t{next(_names)}"
    conn.admin.create_table(name, tally.TableDescriptor(
        builder.build(), bucket_count=buckets,
        properties={"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}))
    return conn.table(name)


def key_of(kind: str, values) -> dict:
    return {c[0]: v for c, v in zip(KINDS[kind][0], values)}


def frozen(key: dict) -> tuple:
    return tuple(sorted(key.items()))


@st.composite
def histories(draw):
    """A key kind, its keys, and rounds of upserts (values may be null) and deletes."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    key = st.tuples(*[c[2] for c in KINDS[kind][0]]).map(lambda v: key_of(kind, v))
    keys = draw(st.lists(key, min_size=1, max_size=12, unique_by=frozen))
    rounds = []
    for _ in range(draw(st.integers(1, 3))):
        upserts = draw(st.lists(st.tuples(st.sampled_from(keys),
                                          st.none() | st.integers(-5, 5),
                                          st.none() | st.sampled_from(["", "a", "é"])),
                                max_size=10))
        deletes = draw(st.lists(st.sampled_from(keys), max_size=3))
        rounds.append(([{**k, "v": v, "s": s} for k, v, s in upserts], deletes))
    absent = draw(st.lists(key, max_size=4))
    return kind, keys, rounds, absent


@settings(max_examples=20, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(history=histories())
def test_lookups_answer_what_the_model_holds(conn, history):
    """Property: after upserts (nulls included) and deletes, `lookup` of every key and
    `lookup_many` of all of them (as dicts and as an Arrow table) answer the model's rows."""
    kind, keys, rounds, absent = history
    table = new_table(conn, kind, buckets=2)
    schema = table.meta.routing.arrow_schema
    model: dict[tuple, dict] = {}
    with table.upsert_writer() as writer:
        for upserts, deletes in rounds:
            if upserts:
                writer.upsert(pa.Table.from_pylist(upserts, schema=schema))
                for row in upserts:
                    model[frozen({c: row[c] for c in table.meta.routing.primary_key})] = row
            if deletes:
                writer.delete(pa.Table.from_pylist(deletes, schema=pa.schema(
                    [schema.field(c) for c in table.meta.routing.primary_key])))
                for key in deletes:
                    model.pop(frozen(key), None)
            writer.flush()
    asked = keys + absent
    expected = [model.get(frozen(k)) for k in asked]
    assert [table.lookup(k) for k in asked] == expected
    assert table.lookup_many(asked) == expected
    arrow = table.lookup_many(pa.Table.from_pylist(asked, schema=pa.schema(
        [schema.field(c) for c in table.meta.routing.primary_key])))
    nothing = {c: None for c in schema.names}
    assert arrow.to_pylist() == [row if row is not None else nothing for row in expected]
    assert table.lookup({**asked[0], "v": 123, "unrelated": object()}) == expected[0], \
        "entries beyond the key are ignored (a whole row is a key)"


def test_a_lookup_reads_the_row_written_just_before_it(conn):
    """Read your acknowledged writes: a lookup after a flush sees it, from the row buffer and
    once the rows went to RocksDB."""
    table = new_table(conn, "int64", buckets=1)
    with table.upsert_writer() as writer:
        for i in range(3):
            writer.upsert([{"k": 7, "v": i, "s": f"s{i}"}])
            writer.flush()
            assert table.lookup({"k": 7}) == {"k": 7, "v": i, "s": f"s{i}"}
        writer.upsert([{"k": n, "v": n, "s": "x" * 100} for n in range(20_000)])  # flushes
        writer.flush()
    assert table.lookup({"k": 7}) == {"k": 7, "v": 7, "s": "x" * 100}
    assert table.lookup({"k": 20_000}) is None


@pytest.mark.parametrize("key, message", [
    ({"k": "seven"}, "key column 'k'.*int64"),
    ({"k": 1.5}, "key column 'k'"),
    ({"k": 2**63}, "key column 'k'"),
    ({"k": None}, r"\['k'\].*null"),
    ({"v": 1}, r"missing primary-key column\(s\) \['k'\]"),
    ({}, r"missing primary-key column\(s\) \['k'\]"),
    (["k", 1], "dict of primary-key values"),
])
def test_a_bad_key_is_refused_naming_the_column(conn, key, message):
    table = new_table(conn, "int64", buckets=1)
    with pytest.raises(InvalidInputError, match=message):
        table.lookup(key)


def test_bad_keys_of_composite_and_partitioned_tables_name_the_column(conn):
    composite = new_table(conn, "composite")
    with pytest.raises(InvalidInputError, match=r"missing primary-key column\(s\) \['c'\]"):
        composite.lookup({"a": "x", "b": 1})
    with pytest.raises(InvalidInputError, match="key column 'b'.*int32"):
        composite.lookup({"a": "x", "b": 2**40, "c": datetime.date(2026, 1, 1)})
    with pytest.raises(InvalidInputError, match="key column 'c'"):
        composite.lookup({"a": "x", "b": 1, "c": "not a date"})
    partitioned = new_table(conn, "partitioned")
    with pytest.raises(InvalidInputError, match=r"\['day'\].*null"):
        partitioned.lookup({"day": None, "k": 1})
    assert partitioned.lookup({"day": "no such day", "k": 1}) is None


def _send(conn, table, header_extra: dict, key: pa.Table | None, raw: bytes | None = None):
    """A lookup request as a client would not send it, to the server of bucket 0."""
    partition = "d1" if table.meta.routing.partitioned else None
    route = conn.route(table.name, partition, 0, table.table_id)
    body = raw if raw is not None else frame({**route.header(), VERSION_FIELD: LOOKUP_VERSION,
                                              **header_extra}, key)
    return conn.server(route.address).lookup(body)


def test_the_server_refuses_bad_keys_naming_the_column(conn):
    table = new_table(conn, "partitioned", buckets=2)
    in_bucket = next(k for k in range(100)
                     if table.bucket_of({"day": "d1", "k": k}) == ("d1", 0))
    elsewhere = next(k for k in range(100)
                     if table.bucket_of({"day": "d1", "k": k}) == ("d1", 1))
    with table.upsert_writer() as writer:
        writer.upsert([{"day": "d1", "k": in_bucket, "v": 1, "s": "a"}])
        writer.flush()
    good = pa.table({"day": ["d1"], "k": pa.array([in_bucket], pa.int64())})
    answer = PointKeys(table.meta.routing).answer_row(_send(conn, table, {}, good))
    assert answer == {"day": "d1", "k": in_bucket, "v": 1, "s": "a"}
    # a key typed otherwise, but castable without loss, is the same key
    narrow = pa.table({"day": ["d1"], "k": pa.array([in_bucket], pa.int16())})
    assert PointKeys(table.meta.routing).answer_row(_send(conn, table, {}, narrow)) == answer
    bad = {
        "not primary-key columns": good.append_column("v", pa.array([1], pa.int64())),
        r"lacks \['k'\]": good.select(["day"]),
        "primary-key column 'k' of the key is null":
            pa.table({"day": ["d1"], "k": pa.array([None], pa.int64())}),
        "key column 'k' .* is int64, not string": pa.table({"day": ["d1"], "k": ["x"]}),
        "belongs to partition 'd2'": pa.table({"day": ["d2"], "k": [in_bucket]}),
        "belongs to bucket 1": pa.table({"day": ["d1"], "k": [elsewhere]}),
        "more than the limit of 1 rows": pa.concat_tables([good, good]),
    }
    for message, key in bad.items():
        with pytest.raises(InvalidInputError, match=message):
            _send(conn, table, {}, key)
    with pytest.raises(InvalidInputError, match="exactly one key"):
        _send(conn, table, {}, None, raw=dumps({"table_id": table.table_id,
                                                 "partition_id": 0, "bucket": 0,
                                                 VERSION_FIELD: LOOKUP_VERSION}))
    with pytest.raises(InvalidInputError, match="malformed Arrow IPC"):
        _send(conn, table, {}, None, raw=dumps({"table_id": table.table_id, VERSION_FIELD: LOOKUP_VERSION})
              + b"\nnot arrow")


def test_decimal_and_binary_keys_survive_exactly(conn):
    """A key's type survives the wire exactly: decimals keep their scale, binary keys with
    zero bytes are not text, and a key one byte longer is another key."""
    table = new_table(conn, "decimal", buckets=2)
    values = [decimal.Decimal("1.10"), decimal.Decimal("-0.01"), decimal.Decimal("9999.99")]
    with table.upsert_writer() as writer:
        writer.upsert([{"k": v, "v": i, "s": None} for i, v in enumerate(values)])
        writer.flush()
    assert [table.lookup({"k": v})["v"] for v in values] == [0, 1, 2]
    assert table.lookup({"k": decimal.Decimal("1.1")})["v"] == 0  # the same number
    with pytest.raises(InvalidInputError, match="key column 'k'"):
        table.lookup({"k": decimal.Decimal("1.001")})  # not representable at scale 2
    binary = new_table(conn, "binary", buckets=2)
    with binary.upsert_writer() as writer:
        writer.upsert([{"k": b"a\x00", "v": 1, "s": None}, {"k": b"a", "v": 2, "s": None}])
        writer.flush()
    assert binary.lookup({"k": b"a\x00"})["v"] == 1
    assert binary.lookup({"k": b"a"})["v"] == 2
    assert binary.lookup({"k": b"a\x00\x00"}) is None


def test_the_server_refuses_bad_canonical_keys_naming_the_column(conn):
    """A key sent as canonical bytes is checked on the server as strictly as an Arrow one:
    its partition, its bucket, each value against its column's type; nothing is read."""
    table = new_table(conn, "partitioned", buckets=2)
    keys = PointKeys(table.meta.routing)
    in_bucket = next(k for k in range(100) if keys.prepare({"day": "d1", "k": k})[1] == 0)
    elsewhere = next(k for k in range(100) if keys.prepare({"day": "d1", "k": k})[1] == 1)
    with table.upsert_writer() as writer:
        writer.upsert([{"day": "d1", "k": in_bucket, "v": 1, "s": "a"}])
        writer.flush()
    route = conn.route(table.name, "d1", 0, table.table_id)
    server = conn.server(route.address)

    def ask(key: bytes, head: bytes | None = None):
        head = head or CANONICAL_HEAD.pack(CANONICAL_MARK, LOOKUP_VERSION, route.table_id,
                                           route.partition_id, route.bucket)
        return keys.answer_row(server.lookup(head + key))

    def text(value: bytes) -> bytes:
        return len(value).to_bytes(4, "little") + value

    def number(value: int) -> bytes:
        return text((value & (2**64 - 1)).to_bytes(8, "little"))

    assert ask(text(b"d1") + number(in_bucket)) == {"day": "d1", "k": in_bucket, "v": 1,
                                                    "s": "a"}
    bad = {
        "belongs to bucket 1": text(b"d1") + number(elsewhere),
        "belongs to partition 'd2'": text(b"d2") + number(in_bucket),
        "key column 'day' .* not valid UTF-8": text(b"\xff") + number(in_bucket),
        "key column 'k' .* a value of 4 bytes": text(b"d1") + text(b"\x00" * 4),
        "bytes beyond its primary-key columns": text(b"d1") + number(in_bucket) + b"\x00",
        "ends before column 'k'": text(b"d1"),
    }
    for message, key in bad.items():
        with pytest.raises(InvalidInputError, match=message):
            ask(key)
    with pytest.raises(InvalidInputError, match="ends inside its head"):
        ask(b"", head=CANONICAL_MARK + bytes(8))
    other = conn.route(table.name, "d1", 1, table.table_id)
    with pytest.raises(InvalidInputError, match="belongs to bucket 0"):  # sent to bucket 1
        conn.server(other.address).lookup(CANONICAL_HEAD.pack(
            CANONICAL_MARK, LOOKUP_VERSION, other.table_id, other.partition_id, 1)
            + text(b"d1") + number(in_bucket))
