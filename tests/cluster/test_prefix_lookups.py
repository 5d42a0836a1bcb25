"""Prefix lookups over a LocalCluster, against a plain-Python model of the table.

Tables of three key shapes: an unpartitioned `(user, day, item)` key (no prefix short of the
whole key names a bucket: every bucket is asked), a `(user, day)` key partitioned by `day`
(the bucket key is `user`: a prefix of `user` asks one bucket per partition) and a
`(day, user)` key partitioned by `day` (a prefix of `day` asks that partition only). Random
upserts and deletes, flushed through a small memory budget so rows are read from row buffers
and RocksDB alike; then prefixes of every length, present and absent, one at a time and all at
once, must answer the model's rows under them in key order. Which buckets are asked is checked
on the plan of requests; bad prefixes are refused with InvalidInputError on the client and,
for requests a client would not send, on the server.
"""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tally
from tally.client import prefix_lookups
from tally.errors import InvalidInputError
from tests.cluster.conftest import private_cluster

_names = itertools.count()
DAYS = ["d1", "d2", "d3"]
BUCKETS = 3

# shape -> (primary key, partition key)
SHAPES = {
    "flat": (("user", "day", "item"), ()),
    "by_day": (("user", "day"), ("day",)),
    "day_first": (("day", "user"), ("day",)),
}
TYPES = {"user": pa.int64(), "day": pa.string(), "item": pa.int32()}
DRAWN = {"user": st.integers(-2, 3), "day": st.sampled_from(DAYS), "item": st.integers(0, 2)}


@pytest.fixture(scope="module")
def cluster_and_conn(tmp_path_factory):
    with private_cluster(tmp_path_factory, "prefixes") as both:
        yield both


@pytest.fixture(scope="module")
def conn(cluster_and_conn):
    return cluster_and_conn[1]


def new_table(conn, shape: str):
    pk, partition_key = SHAPES[shape]
    builder = tally.Schema.builder()
    for name in pk:
        builder = builder.column(name, TYPES[name])
    builder = (builder.agg_column("n", pa.int64(), tally.AggFunction.SUM)
               .agg_column("s", pa.string(), tally.AggFunction.LAST_VALUE).primary_key(*pk))
    if partition_key:
        builder = builder.partition_key(*partition_key)
    name = f"prefixes.t{next(_names)}"
    conn.admin.create_table(name, tally.TableDescriptor(
        builder.build(), bucket_count=BUCKETS,
        properties={"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}))
    return conn.table(name)


@st.composite
def histories(draw):
    shape = draw(st.sampled_from(sorted(SHAPES)))
    pk = SHAPES[shape][0]
    key = st.fixed_dictionaries({c: DRAWN[c] for c in pk})
    rounds = []
    for _ in range(draw(st.integers(1, 3))):
        upserts = draw(st.lists(st.tuples(key, st.integers(-3, 3), st.sampled_from(["a", "b"])),
                                max_size=12))
        deletes = draw(st.lists(key, max_size=3))
        rounds.append(([{**k, "n": n, "s": s} for k, n, s in upserts], deletes))
    asked = draw(st.lists(st.tuples(st.integers(1, len(pk)), key), min_size=1, max_size=4))
    return shape, rounds, [{c: k[c] for c in pk[:length]} for length, k in asked]


@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(history=histories())
def test_prefix_lookups_answer_the_models_rows(conn, history):
    """Property: after upserts and deletes, `prefix_lookup` of each prefix and
    `prefix_lookup_many` of the prefixes of one length answer the model's rows under them,
    ordered by primary key."""
    shape, rounds, asked = history
    table = new_table(conn, shape)
    pk = list(SHAPES[shape][0])
    model: dict[tuple, dict] = {}
    with table.upsert_writer() as writer:
        for upserts, deletes in rounds:
            if upserts:
                writer.upsert(upserts)
                for row in upserts:
                    key = tuple(row[c] for c in pk)
                    old = model.get(key)
                    model[key] = {**row, "n": row["n"] + (old["n"] if old else 0)}
            if deletes:
                writer.delete(deletes)
                for key in deletes:
                    model.pop(tuple(key[c] for c in pk), None)
            writer.flush()

    def expected(prefixes: list[dict]) -> list[dict]:
        return [model[k] for k in sorted(model)
                if any(all(model[k][c] == v for c, v in p.items()) for p in prefixes)]

    columns = pk + ["n", "s"]
    for prefix in asked:
        assert table.prefix_lookup(prefix).select(columns).to_pylist() == expected([prefix])
    for length in {len(p) for p in asked}:
        group = [p for p in asked if len(p) == length]
        assert table.prefix_lookup_many(group).select(columns).to_pylist() == expected(group)


def test_the_buckets_asked(conn):
    """A prefix holding the bucket key asks one bucket per partition, one holding the
    partition key that partition's buckets only, any other every bucket; the answer is the
    same rows either way, and `columns` picks the columns."""
    rows = [{"user": u, "day": d, "n": 1, "s": "x"} for u in range(6) for d in DAYS]
    by_day, day_first = new_table(conn, "by_day"), new_table(conn, "day_first")
    flat = new_table(conn, "flat")
    for table in (by_day, day_first):
        with table.upsert_writer() as writer:
            writer.upsert(rows)
    with flat.upsert_writer() as writer:
        writer.upsert([{**r, "item": 0} for r in rows])

    def asked(table, prefix) -> set:
        meta = conn.table_meta(table.name, refresh=True)
        found = prefix_lookups.requests(meta, prefix_lookups.prefixes_of(meta.routing, prefix))
        return {(r.partition, r.bucket) for r in found}

    user = by_day.bucket_of({"user": 4, "day": "d1"})[1]
    assert asked(by_day, {"user": 4}) == {(d, user) for d in DAYS}
    assert asked(day_first, {"day": "d2"}) == {("d2", b) for b in range(BUCKETS)}
    assert asked(day_first, {"day": "d2", "user": 4}) == {("d2", user)}
    assert asked(flat, {"user": 4}) == {(None, b) for b in range(BUCKETS)}
    assert asked(flat, {"user": 4, "day": "d1"}) == {(None, b) for b in range(BUCKETS)}
    assert by_day.prefix_lookup({"user": 4}, columns=["day", "n"]).to_pylist() == [
        {"day": d, "n": 1} for d in DAYS]
    assert day_first.prefix_lookup({"day": "d2"}, columns=["user"]).to_pylist() == [
        {"user": u} for u in range(6)]
    assert flat.prefix_lookup({"user": 4}).num_rows == len(DAYS)
    assert day_first.prefix_lookup({"day": "d9"}).num_rows == 0  # no such partition
    assert by_day.prefix_lookup({"user": 99}).num_rows == 0


@pytest.mark.parametrize("prefix, says", [
    ({"day": "d1"}, "the leading key columns are required (it lacks ['user'])"),
    ({"user": 1, "item": 1}, "lacks ['day']"),
    ({"nope": 1}, "unknown column(s) ['nope']"),
    ({"user": 1, "n": 1}, "not primary-key columns"),
    ({"user": "seven"}, "'user'"),
    ({"user": 1.5}, "'user'"),
    ({"user": None}, "['user']"),
])
def test_bad_prefixes_are_refused_by_the_client(conn, prefix, says):
    table = new_table(conn, "flat")
    with pytest.raises(InvalidInputError) as refused:
        table.prefix_lookup(prefix)
    assert says in str(refused.value)


def test_bad_requests_are_refused_by_the_server(conn):
    """Requests the client would not send: a prefix that is not leading, one sent to
    another bucket or partition than its own, none at all, two at once."""
    table = new_table(conn, "by_day")
    with table.upsert_writer() as writer:
        writer.upsert([{"user": 1, "day": "d1", "n": 1, "s": "x"}])
    meta = conn.table_meta(table.name, refresh=True)
    user = meta.routing.bucket_of({"user": 1})
    route = meta.route("d1", user)
    other = meta.route("d1", (user + 1) % BUCKETS)
    header = {"op": "prefix_lookup", **route.header()}
    cases = [
        (route, {}, pa.table({"day": ["d1"]}), "lacks ['user']"),
        (other, {}, pa.table({"user": [1]}), f"belongs to bucket {user}"),
        (route, {}, pa.table({"user": [1], "day": ["d2"]}), "belongs to partition 'd2'"),
        (route, {}, None, "exactly one key prefix"),
        (route, {"batch_size": 0}, pa.table({"user": [1]}), "batch_size"),
    ]
    for to, extra, payload, says in cases:
        with pytest.raises(InvalidInputError) as refused:
            conn.server(to.address).get({"op": "prefix_lookup", **to.header(), **extra},
                                        payload)
        assert says in str(refused.value), says
    answer = conn.server(route.address).get(header, pa.table({"user": [1]}))
    assert answer.select(["user", "day", "n"]).to_pylist() == [{"user": 1, "day": "d1", "n": 1}]


# --- the command: tally lookup TABLE --prefix COLUMN=VALUE ... ----------------------------------


def test_the_lookup_command_prints_the_rows_under_a_prefix(capsys, cluster_and_conn):
    """`tally lookup TABLE --prefix user=4` prints the rows under the prefix in key order,
    as the point lookup prints its row; none is status 3, bad prefixes status 2, each
    failure one line naming the problem."""
    from tally.cli.main import main

    cluster, conn = cluster_and_conn
    table = new_table(conn, "by_day")
    with table.upsert_writer() as writer:
        writer.upsert([{"user": u, "day": d, "n": u, "s": d} for u in (3, 4) for d in DAYS])

    def run(*argv) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main([*argv, "--url", cluster.url])
        out, err = capsys.readouterr()
        return status, out, err

    status, out, _ = run("lookup", table.name, "--prefix", "user=4", "--format", "json")
    assert status == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"user": 4, "day": d, "n": 4, "s": d} for d in DAYS]
    status, out, _ = run("lookup", table.name, "--prefix", "user=3", "--prefix", "day=d2")
    assert status == 0 and "d2" in out and "d1" not in out and "user" in out.splitlines()[0]
    status, out, err = run("lookup", table.name, "--prefix", "user=99")
    assert (status, out) == (3, "") and err.startswith("tally: no row under key prefix user=99")
    for argv, words in [(["--prefix", "day=d1"], ["leading key columns are required",
                                                  "['user']"]),
                        (["--prefix", "user=seven"], ["user", "'seven'"]),
                        (["--prefix", "nope=1"], ["'nope'"]),
                        (["--prefix", "user"], ["COLUMN=VALUE"]),
                        (["user=4", "day=d1", "--prefix", "user=4"], ["not both"]),
                        ([], ["--prefix"])]:
        status, _, err = run("lookup", table.name, *argv)
        assert status == 2, argv
        assert err.startswith("tally: ") and err.count("\n") == 1, err
        for word in words:
            assert word in err, (word, err)
