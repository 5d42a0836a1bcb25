"""A source and its rollups move by whole epochs together: the epoch protocol against a model.

The writer is the one both Spark sinks run (sink.protocol.WriterRun with the data source's
delivery, sink.funnel: each input partition's rows folded, and projected into every rollup,
as a task does), in this process, against a real cluster. A crash is a `Crash` raised inside a
bucket's write (of the source or of a rollup) or right after the commit landed: it passes by
the writer's rollback as a dead process would, and the writer is abandoned. The restarted
writer (same owner) recovers every table and replays the epoch, as Spark replays an
uncommitted micro-batch. Rollups are added (from now on) and dropped between epochs. After
every epoch and every restart:
  - the source and every rollup hold exactly the model's aggregate of the committed epochs
    (each once; a rollup those committed after it was added);
  - every owner (the source's and each rollup's) is at the same last committed epoch.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge_engine import Schema, TableDescriptor
from tally.errors import InvalidInputError

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.types import (IntegerType, LongType, StructField,  # noqa: E402
                               StructType, TimestampType)

DB = "rollup_epochs"
BUCKETS = 2
HOUR = dt.timedelta(hours=1)
BASE = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
SPARK_SCHEMA = StructType([StructField("k", IntegerType()), StructField("ts", TimestampType()),
                           StructField("v", LongType()), StructField("m", LongType())])
_names = itertools.count()

# The rollups a test may add: (suffix, keys, columns), and how the model computes each.
ROLLUPS = {
    "by_k": (["k"], {"v": "sum(v)", "n": "count(*)"}),
    "by_hour": (["date_trunc('hour', ts) AS hour"], {"v": "sum(v)", "m": "max(m)"}),
    "by_k_day": (["k", "date_trunc('day', ts) AS day"], {"v": "sum(v)", "m": "max(m)"}),
}


class Crash(BaseException):
    """A process that died where it was raised: no rollback runs."""


_crash = {"table": None, "bucket": None}


def crash_hook(plan, epoch, attempt_number: int, bucket: int) -> None:
    """The bucket write hook (sink option fail-hook): crash in the chosen table and bucket."""
    if plan.table == _crash["table"] and bucket == _crash["bucket"]:
        _crash["table"] = None
        raise Crash(f"crash in {plan.table} bucket {bucket}")


def create_source(conn) -> str:
    name = f"{DB}.src_{next(_names)}"
    schema = (Schema.builder().column("k", pa.int32())
              .column("ts", pa.timestamp("us", tz="UTC"))
              .agg_column("v", pa.int64(), "sum").agg_column("m", pa.int64(), "max")
              .primary_key("k", "ts").build())
    conn.admin.create_database(DB, ignore_if_exists=True)
    conn.admin.create_table(name, TableDescriptor(
        schema, bucket_count=BUCKETS, properties={"table.merge-engine": "aggregation"}))
    return name


def add_rollup(conn, source: str, kind: str) -> str:
    keys, columns = ROLLUPS[kind]
    name = f"{source}_{kind}"
    conn.admin.create_rollup(source, name, keys, columns, start="from-now", bucket_count=BUCKETS)
    return name


class Writer:
    """One run of the sink's writer of `source` (its owner fixed), epoch by epoch."""

    def __init__(self, cluster, source: str, owner: str):
        from sink.options import SinkOptions

        self.options = SinkOptions.parse({"fail-hook": f"{__name__}:crash_hook"},
                                         url=cluster.url, table=source)
        self.owner = owner
        self.run = None

    def open(self):
        from sink.protocol import WriterRun

        self.run = WriterRun.connect(self.options, None, self.owner, schema=SPARK_SCHEMA)
        return self.run

    def write(self, epoch: int, rows: list[tuple]):
        from sink.funnel import FunnelDelivery, fold_task_rows
        from sink.rollup_feeds import rollup_feeds

        run = self.run
        feeds = rollup_feeds(run.conn, run.plan)
        batch = pa.record_batch(
            [pa.array([r[0] for r in rows], pa.int32()),
             pa.array([BASE + r[1] * HOUR for r in rows], pa.timestamp("us", tz="UTC")),
             pa.array([r[2] for r in rows], pa.int64()),
             pa.array([r[3] for r in rows], pa.int64())], names=["k", "ts", "v", "m"])
        part, rollup_parts = fold_task_rows(run.plan, feeds, [batch], 0, f"epoch {epoch}", None)

        class Message:
            pass

        message = Message()
        message.rollup_parts = rollup_parts
        return run.write_epoch(epoch, f"epoch {epoch}", FunnelDelivery([part], feeds, [message]))


def model(kind: str | None, epochs: list[list[tuple]]) -> dict:
    """{key: {column: value}} of the source (kind None) or a rollup over the epochs' rows."""
    out: dict = {}
    for rows in epochs:
        for k, hour, v, m in rows:
            ts = BASE + hour * HOUR
            if kind is None:
                key, cells = (k, ts), {"v": v, "m": m}
            elif kind == "by_k":
                key, cells = (k,), {"v": v, "n": 1}
            elif kind == "by_hour":
                key, cells = (ts,), {"v": v, "m": m}
            else:
                key, cells = (k, ts.replace(hour=0)), {"v": v, "m": m}
            held = out.setdefault(key, {})
            for column, value in cells.items():
                if column == "m":
                    held[column] = max(held.get(column, value), value)
                else:
                    held[column] = held.get(column, 0) + value
    return out


def stored(conn, name: str) -> dict:
    table = conn.table(name).to_arrow()
    info = conn.admin.describe_table(name)
    keys = list(info.descriptor.schema.primary_key)
    out = {}
    for row in table.to_pylist():
        out[tuple(row[k] for k in keys)] = {c: v for c, v in row.items() if c not in keys}
    return out


def last_commits(conn, source: str, owner: str, rollups: dict) -> set:
    from sink.rollup_feeds import rollup_owner_id

    found = [conn.locks.last_commit(source, owner)]
    found += [conn.locks.last_commit(name, rollup_owner_id(owner, name)) for name in rollups]
    return {None if c is None else c.epoch for c in found}


rows_strategy = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30),
                                   st.integers(-50, 50), st.integers(-50, 50)),
                         min_size=1, max_size=12)
step_strategy = st.tuples(
    rows_strategy,
    st.sampled_from([None, None, "source", "rollup", "after-commit"]),
    st.integers(0, BUCKETS - 1),
    st.sampled_from([None, None, None, "add", "drop"]),
)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(first=st.sampled_from(sorted(ROLLUPS)), steps=st.lists(step_strategy, min_size=2,
                                                              max_size=4))
def test_source_and_rollups_commit_every_epoch_together_through_crashes(cluster, first, steps):
    from tally import client

    conn = client.connect(cluster.url)
    try:
        source = create_source(conn)
        rollups = {add_rollup(conn, source, first): (first, 0)}  # name: (kind, first epoch)
        owner = f"model-{source}"
        writer = Writer(cluster, source, owner)
        writer.open()
        committed: list[list[tuple]] = []
        for epoch, (rows, crash, bucket, change) in enumerate(steps):
            if change == "add":
                free = [k for k in sorted(ROLLUPS) if f"{source}_{k}" not in rollups]
                if free:
                    rollups[add_rollup(conn, source, free[0])] = (free[0], epoch)
            elif change == "drop" and len(rollups) > 1:
                name = sorted(rollups)[0]
                conn.admin.drop_rollup(name)
                del rollups[name]
            _crash["table"], _crash["bucket"] = None, None
            if crash == "source":
                _crash["table"], _crash["bucket"] = source, bucket
            elif crash == "rollup":
                _crash["table"], _crash["bucket"] = sorted(rollups)[-1], bucket
            landed = crash == "after-commit"
            if landed:
                real = writer.run.conn.locks.commit_together

                def commit_then_die(commits, at, real=real):
                    real(commits, at)
                    raise Crash("died after the commit landed")

                writer.run.conn.locks.commit_together = commit_then_die
            try:
                writer.write(epoch, rows)
            except Crash:
                writer.run.abandon()
                writer.open()  # the restart: every table recovered
                writer.write(epoch, rows)  # Spark replays the epoch: skipped if it landed
            committed.append(rows)
            _crash["table"] = None
            assert stored(conn, source) == model(None, committed)
            for name, (kind, since) in rollups.items():
                assert stored(conn, name) == model(kind, committed[since:]), name
            assert last_commits(conn, source, owner, rollups) == {epoch}
        writer.run.end()
        assert conn.locks.describe(source) == []
        for name in rollups:
            assert conn.locks.describe(name) == []
    finally:
        _crash["table"] = None
        conn.close()


def test_a_failed_rollup_write_rolls_back_the_source_too(cluster):
    """A write refused in a rollup (its sum overflows there only) is rolled back everywhere,
    and the error says nothing was applied."""
    from sink.epoch_errors import EpochFailedError
    from tally import client

    conn = client.connect(cluster.url)
    try:
        source = create_source(conn)
        name = add_rollup(conn, source, "by_hour")
        writer = Writer(cluster, source, f"overflow-{source}")
        writer.open()
        writer.write(0, [(1, 0, 2**62, 0)])
        before = (stored(conn, source), stored(conn, name))
        # a new key of the source, fine there; it overflows the rollup's one row
        with pytest.raises(EpochFailedError) as raised:
            writer.write(1, [(2, 0, 2**62, 0)])
        assert raised.value.rolled_back
        assert "nothing of it was applied" in str(raised.value)
        assert (stored(conn, source), stored(conn, name)) == before
        writer.write(1, [(2, 0, 5, 1)])
        assert stored(conn, name)[(BASE,)] == {"v": 2**62 + 5, "m": 1}
        writer.run.end()
    finally:
        conn.close()


def test_a_write_lacking_a_rollup_key_source_is_refused_before_anything(cluster):
    from tally import client

    conn = client.connect(cluster.url)
    try:
        source = create_source(conn)
        # the rollup's key comes from a value column the source's writers may leave out
        conn.admin.create_rollup(source, f"{source}_by_m", ["m"], {"v": "sum(v)"},
                                 start="from-now", bucket_count=BUCKETS)
        from sink.options import SinkOptions
        from sink.protocol import WriterRun

        options = SinkOptions.parse({}, url=cluster.url, table=source, columns=["k", "ts", "v"])
        schema = StructType(SPARK_SCHEMA.fields[:3])
        with pytest.raises(InvalidInputError, match="'m'"):
            run = WriterRun.connect(options, None, f"partial-{source}", schema=schema)
            try:
                run.write_epoch(0, "epoch 0", lambda *a: [])
            finally:
                run.end()
        assert stored(conn, source) == {}
        assert conn.locks.describe(source) == []  # refused before the lock was taken
    finally:
        conn.close()
