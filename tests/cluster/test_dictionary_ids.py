"""Dictionary tables on a real cluster: ids assigned insert-if-absent by bucket leaders.

The model test drives one dictionary (3 buckets, 2 copies each) with any interleaving of two
clients assigning overlapping key sets, one after the other or at the same time, of leader
moves and of kill -9 and restart of either tablet server, against a plain-Python model: the
first id answered for a key. Every answer must agree with the model (stable: never another id
for a key, across failovers), no two keys share an id (unique), every key's id names its own
bucket (id mod buckets), and each bucket holds exactly the ids b, b + n, b + 2n, ... up to its
count (dense, the documented bound). At the end both copies of every bucket hold the same rows.
Bad input is refused with a typed error naming it, and assigns nothing.
"""

from __future__ import annotations

import itertools
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import tally
from merge_engine.table.dictionary import KEY_COLUMN
from tally.errors import InvalidInputError, SchemaError
from tally.wire.channel import FlightChannel
from tests.cluster.replica_checks import (copies_of, replica_rows_equal, restart_stopped_servers,
                                          wait_fully_in_sync)

BUCKETS = 3
KEYS = [f"user-{i}" for i in range(10)] + ["", "ü-naïve"]
_names = itertools.count()

keys_st = st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)
step_st = st.one_of(
    st.tuples(st.just("assign"), st.integers(0, 1), keys_st),
    st.tuples(st.just("together"), keys_st, keys_st),
    st.tuples(st.just("move"), st.integers(0, BUCKETS - 1)),
    st.tuples(st.just("restart"), st.integers(0, 1)),
)


def new_dictionary(conn, buckets: int = BUCKETS, **options) -> str:
    name = f"default.dict{next(_names)}"
    conn.admin.create_dictionary(name, buckets=buckets, options=options)
    return name


class Model:
    """The first id answered for each key; every later answer must agree."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def answered(self, keys: list[str], ids: pa.Array) -> None:
        assert ids.null_count == 0 and len(ids) == len(keys)
        for key, found in zip(keys, ids.to_pylist()):
            assert self.ids.setdefault(key, found) == found, \
                f"key {key!r} got id {found}, earlier {self.ids[key]}"
        assert len(set(self.ids.values())) == len(self.ids), f"two keys share an id: {self.ids}"


def check_table(table, model: Model) -> None:
    """The stored ids: the model's, each in its key's bucket, each bucket dense."""
    rows = table.to_arrow().to_pylist()
    stored = {r[KEY_COLUMN]: r["id"] for r in rows}
    for key, found in model.ids.items():
        assert stored.get(key) == found, (key, stored.get(key), found)
    per_bucket: dict[int, list[int]] = {}
    for key, found in stored.items():
        bucket = table.bucket_of({KEY_COLUMN: key})[1]
        assert found % BUCKETS == bucket, (key, found, bucket)
        per_bucket.setdefault(bucket, []).append(found)
    for bucket, ids in per_bucket.items():
        assert sorted(ids) == [bucket + BUCKETS * k for k in range(len(ids))], (bucket, ids)
    assert table.lookup_ids(list(model.ids)).to_pylist() == list(model.ids.values())


@pytest.fixture
def clients(cluster):
    with tally.connect(cluster.url, retry_timeout=180) as a, \
            tally.connect(cluster.url, retry_timeout=180) as b:
        yield a, b
    restart_stopped_servers(cluster)


@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@example(steps=[("assign", 0, KEYS[:6]), ("move", 0), ("assign", 1, KEYS[3:9]), ("move", 0),
                ("assign", 0, KEYS[6:]), ("move", 1), ("move", 2), ("assign", 1, KEYS)])
@example(steps=[("assign", 0, ["user-1", "user-2", "user-3"]), ("restart", 0),
                ("together", ["user-1", "user-4", "user-5"], ["user-5", "user-4", "user-6"]),
                ("restart", 1), ("assign", 1, ["user-6", "user-7", "", "ü-naïve"]),
                ("move", 0), ("assign", 0, ["user-8", "user-1", "user-9"])])
@given(steps=st.lists(step_st, min_size=1, max_size=6))
def test_assignments_against_a_model(cluster, clients, steps):
    conn = clients[0]
    name = new_dictionary(conn, **{"table.replication.factor": "2"})
    tables = [c.table(name) for c in clients]
    model = Model()
    for step in steps:
        kind = step[0]
        if kind == "assign":
            _, client, keys = step
            model.answered(keys, tables[client].ids(keys))
        elif kind == "together":
            answers: dict[int, pa.Array] = {}

            def assign(i: int, keys: list[str]) -> None:
                answers[i] = tables[i].ids(keys)

            threads = [threading.Thread(target=assign, args=(i, keys))
                       for i, keys in enumerate(step[1:])]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(answers) == [0, 1], "an assignment failed (see its thread's error)"
            for i, keys in enumerate(step[1:]):
                model.answered(keys, answers[i])
        elif kind == "move":
            replicas = wait_fully_in_sync(conn, name, cluster)[(None, step[1])]
            other = next(s for s in replicas["replicas"] if s != replicas["leader"])
            conn.admin.move_leader(name, step[1], to=other)
        else:  # kill -9 and start again: what it led moves to the other copy meanwhile
            cluster.restart_tablet_server(step[1], kill=True)
        check_table(tables[0], model)
    replicas = wait_fully_in_sync(conn, name, cluster)
    if any(step[0] in ("move", "restart") for step in steps):  # a leader changed meanwhile
        assert max(r["leader_epoch"] for r in replicas.values()) > 0, replicas
    check_table(tables[1], model)
    table_id = conn.table_meta(name).table_id
    for bucket in range(BUCKETS):
        replica_rows_equal(cluster, conn, name, bucket,
                           copies_of(cluster, table_id, 0, bucket, conn=conn, name=name))
    conn.admin.drop_table(name)


def test_a_leader_moved_away_and_back_continues_after_its_successors_ids(cluster, conn):
    """Leadership of a one-bucket dictionary goes to the other copy and back: each leader
    continues from the ids the bucket holds, not from what it assigned when it led before."""
    name = new_dictionary(conn, buckets=1, **{"table.replication.factor": "2"})
    table = conn.table(name)
    answered = table.ids(["a", "b"]).to_pylist()
    for keys in (["c", "d"], ["e"], ["f", "a"]):
        replicas = wait_fully_in_sync(conn, name, cluster)[(None, 0)]
        other = next(s for s in replicas["replicas"] if s != replicas["leader"])
        conn.admin.move_leader(name, 0, to=other)
        answered += table.ids(keys).to_pylist()
    assert answered == [0, 1, 2, 3, 4, 5, 0]
    assert table.lookup_ids(list("abcdef")).to_pylist() == [0, 1, 2, 3, 4, 5]


def test_ids_are_dense_per_bucket_and_lookups_assign_nothing(conn):
    name = new_dictionary(conn, buckets=2)
    table = conn.table(name)
    assert table.lookup_ids(["a", "b"]).to_pylist() == [None, None]
    # more keys per bucket than one request carries: each bucket is asked in several requests
    keys = [f"k{i}" for i in range(10_000)]
    ids = table.ids(pa.array(keys * 2))
    assert ids.type == pa.uint32()
    first = ids.slice(0, len(keys)).to_pylist()
    assert first == ids.slice(len(keys)).to_pylist()
    per_bucket = [sorted(i for i in first if i % 2 == b) for b in range(2)]
    for b, held in enumerate(per_bucket):
        assert held == [b + 2 * k for k in range(len(held))]
    assert max(first) < 2 * max(len(held) for held in per_bucket)
    assert table.lookup_ids(["k3", "zz"]).to_pylist() == [first[3], None]
    assert table.to_arrow().num_rows == len(keys)


def test_an_int64_dictionary_and_binary_keys(conn):
    name = f"default.dict{next(_names)}"
    conn.admin.create_dictionary(name, id_type="int64", key_type="binary", buckets=2)
    table = conn.table(name)
    ids = table.ids([b"\x00", b"\xff", b"\x00"])
    assert ids.type == pa.int64() and ids[0] == ids[2] and ids[0] != ids[1]
    with pytest.raises(InvalidInputError, match="is not bytes"):
        table.ids(["text"])
    info = conn.admin.describe_table(name)
    assert info.descriptor.properties["dictionary.id-type"] == "int64"


@pytest.mark.parametrize("keys, match", [
    (["ok", None], "key 1 is null"),
    (["ok", 7], r"key 1 \(7\) is not str"),
    (pa.array([1, 2]), "are string, not int64"),
    ("alice", "a list or an Arrow array"),
])
def test_bad_keys_are_refused_and_assign_nothing(conn, keys, match):
    name = new_dictionary(conn)
    table = conn.table(name)
    with pytest.raises(InvalidInputError, match=match):
        table.ids(keys)
    assert table.to_arrow().num_rows == 0


def test_the_server_checks_what_the_client_checks(cluster, conn):
    """Requests made by hand reach the server's own checks: a null key, a key of another type,
    another column, a table that is no dictionary; nothing is assigned."""
    name = new_dictionary(conn, buckets=1)
    plain = f"default.plain{next(_names)}"
    schema = (tally.Schema.builder().column("key", pa.string())
              .agg_column("id", pa.int64(), tally.AggFunction.SUM).primary_key("key").build())
    conn.admin.create_table(plain, tally.TableDescriptor(
        schema, properties={"table.merge-engine": "aggregation"}))
    for table, keys, match in [
            (name, pa.table({"key": pa.array(["a", None])}), "key 1 .* is null"),
            (name, pa.table({"key": pa.array([b"a"])}), "are string, not binary"),
            (name, pa.table({"key": ["a"], "id": [1]}), "the one column 'key'"),
            (plain, pa.table({"key": ["a"]}), "is not a dictionary table")]:
        route = conn.route(table, None, 0, conn.table_meta(table).table_id)
        channel = FlightChannel(route.address, timeout=60)
        try:
            with pytest.raises(InvalidInputError, match=match):
                channel.binary_action("assign_ids", route.header(), keys)
        finally:
            channel.close()
    assert conn.table(name).to_arrow().num_rows == 0
    assert conn.table(plain).to_arrow().num_rows == 0
    with pytest.raises(InvalidInputError, match="is not a dictionary table"):
        conn.table(plain).ids(["a"])
    with pytest.raises(InvalidInputError, match="is not a dictionary table"):
        conn.table(plain).lookup_ids(["a"])


def test_plain_writes_to_a_dictionary_are_refused(conn):
    name = new_dictionary(conn, buckets=1)
    table = conn.table(name)
    table.ids(["a"])
    with pytest.raises(InvalidInputError, match="is a dictionary table"):
        with table.upsert_writer() as writer:
            writer.upsert(pa.table({"key": ["b"], "id": pa.array([0], pa.uint32())}))
    with pytest.raises(InvalidInputError, match="is a dictionary table"):
        with table.upsert_writer() as writer:
            writer.delete(pa.table({"key": ["a"]}))
    assert table.to_arrow().to_pylist() == [{"key": "a", "id": 0}]


def test_a_dictionary_is_made_whole_or_not_at_all():
    from merge_engine.table.dictionary import dictionary_descriptor

    with pytest.raises(SchemaError, match="id type is one of"):
        dictionary_descriptor("int16")
    with pytest.raises(SchemaError, match="key type is one of"):
        dictionary_descriptor(key_type="int64")
    with pytest.raises(SchemaError, match="row TTL"):
        dictionary_descriptor(options={"table.kv.row-ttl": "1h"})


def test_an_exhausted_dictionary_refuses_whole_requests(tmp_path):
    """A one-bucket int32 dictionary whose largest id is 2^32 - 2 (stored into the bucket of
    a real in-process server, as 2^32 - 1 assignments would leave it) has one id left: a
    request for two new keys is refused whole, then one key gets the last id."""
    import argparse

    from tally.server.process import ServerProcess
    from tally.server.serve_args import add_serve_arguments

    args = add_serve_arguments(argparse.ArgumentParser()).parse_args(
        ["--data-dir", str(tmp_path)])
    process = ServerProcess(args)
    try:
        with tally.connect(process.address, retry_timeout=60) as conn:
            conn.admin.create_database("db", ignore_if_exists=True)
            table_id = conn.admin.create_dictionary("db.full", buckets=1)
            table = conn.table("db.full")
            assert table.ids(["first"]).to_pylist() == [0]
            hosted = process.tablet_server.tablet(table_id, 0, 0)
            with hosted.lock:
                hosted.tablet.put(pa.table({"key": ["top"],
                                            "id": pa.array([2**32 - 2], pa.uint32())}))
            with pytest.raises(InvalidInputError, match="db.full is exhausted in bucket 0"):
                table.ids(["x", "y", "first"])
            assert table.lookup_ids(["x", "y", "first"]).to_pylist() == [None, None, 0]
            assert table.ids(["x", "first"]).to_pylist() == [2**32 - 1, 0]
            with pytest.raises(InvalidInputError, match="exhausted"):
                table.ids(["y"])
            assert table.to_arrow().num_rows == 3
    finally:
        process.close()
