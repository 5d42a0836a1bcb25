"""Python reads over a LocalCluster: scan (projection, filter, batches, one offset per bucket),
lookup_many, to_pandas, and their bounds and errors.

One cluster for the module (reads do not depend on the metadata store), with a small memory
budget so row buffers keep being flushed while tests write and scan. The reference is a
plain-Python model of the table's rows.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tally
from tally.errors import InvalidInputError, MissingDependencyError
from tally.wire.messages import MAX_LOOKUP_KEYS
from tests.cluster.conftest import private_cluster

_names = itertools.count()
DAYS = ["d1", "d2", "d3"]
SCHEMA = (tally.Schema.builder().column("day", pa.string()).column("k", pa.int64())
          .agg_column("total", pa.int64(), tally.AggFunction.SUM)
          .agg_column("tag", pa.string(), tally.AggFunction.LAST_VALUE)
          .primary_key("day", "k").partition_key("day").build())


@pytest.fixture(scope="module")
def reads_cluster_and_conn(tmp_path_factory):
    with private_cluster(tmp_path_factory, "reads") as both:
        yield both


@pytest.fixture(scope="module")
def reads_cluster(reads_cluster_and_conn):
    return reads_cluster_and_conn[0]


@pytest.fixture(scope="module")
def conn(reads_cluster_and_conn):
    return reads_cluster_and_conn[1]


def new_table(conn, schema=SCHEMA, buckets: int = 3):
    name = f"reads.t{next(_names)}"
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets, properties={"table.merge-engine": "aggregation"}))
    return conn.table(name)


def write(table, rows: list[dict]) -> None:
    writer = table.upsert_writer()
    writer.upsert(pa.Table.from_pylist(rows, schema=SCHEMA.to_arrow()))
    writer.flush()
    writer.close()


def model_of(rows: list[dict]) -> dict:
    state: dict = {}
    for r in rows:
        key = (r["day"], r["k"])
        old = state.setdefault(key, {"day": r["day"], "k": r["k"], "total": 0, "tag": None})
        old["total"] += r["total"]
        old["tag"] = r["tag"]
    return state


row = st.fixed_dictionaries({"day": st.sampled_from(DAYS), "k": st.integers(0, 30),
                             "total": st.integers(-100, 100), "tag": st.sampled_from("abc")})
filters = st.fixed_dictionaries({}, optional={
    "day": st.one_of(st.sampled_from(DAYS), st.lists(st.sampled_from(DAYS + ["d9"]), max_size=2)),
    "k": st.one_of(st.integers(0, 31), st.lists(st.integers(0, 31), max_size=3)),
    "tag": st.lists(st.sampled_from("abc"), min_size=1, max_size=2)})


def matches(r: dict, where: dict) -> bool:
    for column, accepted in where.items():
        values = accepted if isinstance(accepted, list) else [accepted]
        if r[column] not in values:
            return False
    return True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(writes=st.lists(st.lists(row, min_size=1, max_size=30), min_size=1, max_size=3),
       where=filters, columns=st.sampled_from([None, ["total", "k"], ["tag"]]),
       batch_size=st.integers(1, 7))
def test_scan_matches_the_model(conn, writes, where, columns, batch_size):
    """Property: a scan returns exactly the model's rows that match the filter, projected, in
    batches of at most batch_size rows; a filter on the whole key reads by lookups, one on the
    partition or bucket key reads only those partitions or buckets."""
    table = new_table(conn)
    for rows in writes:
        write(table, rows)
    expected = [r for r in model_of([r for rows in writes for r in rows]).values()
                if matches(r, where)]
    scan = table.scan(columns=columns, filter=where, batch_size=batch_size)
    batches = list(scan)
    assert all(0 < b.num_rows <= batch_size for b in batches)
    names = columns or ["day", "k", "total", "tag"]
    got = [r for b in batches for r in b.to_pylist()]
    assert sorted(map(repr, got)) == sorted(repr({c: r[c] for c in names}) for r in expected)
    # what was read: never more than the filter allows
    pinned_days = where.get("day")
    if pinned_days is not None:
        allowed = set(pinned_days if isinstance(pinned_days, list) else [pinned_days])
        assert {p.partition for p in scan.parts} <= allowed
    if "k" in where:
        ks = where["k"] if isinstance(where["k"], list) else [where["k"]]
        buckets = {table.bucket_of({"day": "d1", "k": k})[1] for k in ks}
        assert {p.bucket for p in scan.parts} <= buckets
        assert all((p.keys is not None) == (pinned_days is not None) for p in scan.parts)
    else:
        assert all(p.keys is None for p in scan.parts)


def test_scan_reads_each_bucket_at_one_offset(conn):
    """Writes that land while a scan streams a bucket (updates to every key, new keys, and the
    buffer flushes they cause) are not in it: the scan holds the rows of the offset it
    reports, which is the bucket's end offset when the scan began."""
    schema = SCHEMA
    table = new_table(conn, schema, buckets=1)
    n = 20_000
    write(table, [{"day": "d1", "k": i, "total": 1, "tag": "old"} for i in range(n)])
    (end_before,) = [v for (p, _), v in table.list_offsets().items() if p == "d1"]
    scan = table.scan(batch_size=1000)
    batches = iter(scan)
    first = [next(batches)]
    write(table, [{"day": "d1", "k": i, "total": 1, "tag": "new"} for i in range(n + 500)])
    rest = list(batches)
    rows = pa.Table.from_batches(first + rest)
    assert rows.num_rows == n
    assert set(rows.column("total").to_pylist()) == {1}
    assert set(rows.column("tag").to_pylist()) == {"old"}
    assert scan.offsets == {("d1", 0): end_before}
    after = table.to_arrow()
    assert after.num_rows == n + 500 and set(after.column("tag").to_pylist()) == {"new"}


def test_to_arrow_and_to_pandas_are_ordered_by_key(conn):
    table = new_table(conn)
    rows = [{"day": d, "k": k, "total": k, "tag": "a"} for d in DAYS for k in range(20)]
    write(table, rows)
    arrow = table.to_arrow()
    assert arrow.to_pylist() == sorted(rows, key=lambda r: (r["day"], r["k"]))
    assert table.to_pandas(columns=["k", "total"], filter={"day": "d2"}).to_dict("records") == \
        [{"k": k, "total": k} for k in range(20)]
    hidden = table.to_arrow(filter={"day": "d1", "k": 3}, unwritten=True)
    assert hidden.column_names == ["day", "k", "total", "tag", "_unwritten"]
    assert hidden.to_pylist()[0]["_unwritten"] == []


def test_to_pandas_without_pandas_names_the_fix(reads_cluster, conn):
    table = new_table(conn)
    code = ("import sys; sys.modules['pandas'] = None\n"
            "import tally\n"
            f"t = tally.connect({reads_cluster.url!r}).table({table.name!r})\n"
            "try:\n    t.to_pandas()\nexcept tally.errors.MissingDependencyError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "refused: Table.to_pandas needs pandas" in out.stdout, out.stderr
    assert issubclass(MissingDependencyError, ImportError)


def test_lookup_many_is_aligned_and_split_into_bounded_requests(conn):
    table = new_table(conn)
    n = 2 * MAX_LOOKUP_KEYS + 100  # several requests per bucket
    write(table, [{"day": "d1", "k": i, "total": i, "tag": "t"} for i in range(0, n, 2)])
    keys = [{"day": "d1", "k": i} for i in range(n)] + [{"day": "d9", "k": 1}]
    rows = table.lookup_many(keys)
    assert len(rows) == len(keys)
    assert rows[-1] is None  # a partition that does not exist
    assert all((rows[i] is None) == (i % 2 == 1) for i in range(n))
    assert all(rows[i]["total"] == i for i in range(0, n, 2))
    arrow = table.lookup_many(pa.table({"day": ["d1", "d1", "d1"], "k": [4, 5, 4]}))
    assert arrow.to_pylist() == [{"day": "d1", "k": 4, "total": 4, "tag": "t"},
                                 {"day": None, "k": None, "total": None, "tag": None},
                                 {"day": "d1", "k": 4, "total": 4, "tag": "t"}]
    assert table.lookup_many([]) == []


def test_server_refuses_an_oversized_lookup_many(conn):
    table = new_table(conn, buckets=1)
    write(table, [{"day": "d1", "k": 1, "total": 1, "tag": "t"}])
    route = conn.route(table.name, "d1", 0, table.table_id)
    keys = pa.table({"day": ["d1"] * (MAX_LOOKUP_KEYS + 1),
                     "k": pa.array(range(MAX_LOOKUP_KEYS + 1), pa.int64())})
    with pytest.raises(InvalidInputError, match="more than the limit of 4,096 rows"):
        conn.server(route.address).lookup_many(route.header(), keys)
    with pytest.raises(InvalidInputError, match="belongs to partition"):
        conn.server(route.address).lookup_many(route.header(),
                                               pa.table({"day": ["d2"], "k": [1]}))


@pytest.mark.parametrize("kwargs, message", [
    ({"columns": ["nope"]}, "unknown column"),
    ({"columns": "k"}, "list of column names"),
    ({"batch_size": 0}, "batch_size"),
    ({"filter": {"nope": 1}}, "column 'nope'"),
    ({"filter": {"k": None}}, "holds null"),
    ({"filter": {"k": "seven"}}, "column 'k'"),
    ({"filter": {"k": 1.5}}, "must be integers"),
    ({"filter": ["k", 1]}, "dict of column"),
    ({"unwritten": "yes"}, "unwritten"),
])
def test_scan_refuses_bad_input(conn, kwargs, message):
    table = new_table(conn, buckets=1)
    with pytest.raises(InvalidInputError, match=message):
        table.scan(**kwargs)


@pytest.mark.parametrize("header, message", [
    ({"batch_size": "10"}, "batch_size"),
    ({"batch_size": 0}, "batch_size"),
    ({"columns": ["nope"]}, "unknown column"),
    ({"columns": "k"}, "columns"),
    ({"unwritten": 1}, "unwritten"),
])
def test_server_refuses_malformed_scans(conn, header, message):
    table = new_table(conn, buckets=1)
    write(table, [{"day": "d1", "k": 1, "total": 1, "tag": "t"}])
    route = conn.route(table.name, "d1", 0, table.table_id)
    with pytest.raises(InvalidInputError, match=message):
        conn.server(route.address).stream({"op": "scan", **header, **route.header()})
    for key in (["k", 1], "x"):
        with pytest.raises(InvalidInputError):
            table.lookup_many([key])


def test_a_bucket_closed_under_a_scan_ends_it_with_an_error(conn):
    """Dropping the table closes its buckets: a scan streaming one of them fails with an error
    that says so (it cannot be retried: its first batches were already handed out)."""
    table = new_table(conn, buckets=1)
    n = 200_000  # thousands of batches: far more than gRPC buffers ahead of the reader
    write(table, [{"day": "d1", "k": i, "total": 1, "tag": "t"} for i in range(n)])
    batches = iter(table.scan(batch_size=50))
    next(batches)
    conn.admin.drop_table(table.name)
    with pytest.raises(tally.errors.TallyError, match="closed while it was being read"):
        for _ in batches:
            pass


def test_filter_text_names_dates_and_decimals_exactly():
    """The Spark `filter` option is JSON, which has no dates or decimals: text is cast to the
    column's type, exactly (a value the type cannot hold exactly is refused)."""
    import datetime
    import decimal

    from tally.client.scan_filter import ScanFilter

    schema = pa.schema([("d", pa.date32()), ("m", pa.decimal128(10, 2))])
    parsed = ScanFilter.parse({"d": "2026-11-23", "m": ["12.50", "12.5"]}, schema)
    assert parsed.values["d"].to_pylist() == [datetime.date(2026, 11, 23)]
    assert parsed.values["m"].to_pylist() == [decimal.Decimal("12.50")]
    with pytest.raises(InvalidInputError, match="column 'm'"):
        ScanFilter.parse({"m": "1.234"}, schema)
