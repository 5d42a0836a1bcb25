"""Reprs a person can read: times as ISO 8601, durations rounded, every function parameter."""

from __future__ import annotations

import pyarrow as pa

import tally
from locks.fencing import HeldLock
from locks.lease import Lease, LockRecord
from recovery.bucket_undo import UndoResult
from recovery.recover import RecoveryReport
from sink.protocol import EpochResult
from tally.client.admin import TableInfo
from tally.timestamps import duration, iso

MOMENT = 1795495623.12  # 2026-11-24T04:47:03.120Z


def test_times_and_durations():
    assert iso(MOMENT) == "2026-11-24T04:47:03.120Z"
    assert iso(float("inf")) == "never"
    assert duration(60.0) == "60s"
    assert duration(1.2487301230430603) == "1.25s"
    assert duration(0.0041234) == "0.00412s"
    assert duration(float("inf")) == "inf"


def test_schema_repr_shows_every_parameter_and_nullability():
    schema = (tally.Schema.builder()
              .column("product", pa.string())
              .agg_column("tags", pa.string(), tally.AggFunction.STRING_AGG, delimiter=";",
                          distinct=True)
              .agg_column("revenue", pa.int64(), tally.AggFunction.SUM)
              .column("region", pa.string(), nullable=False)
              .primary_key("product", "region").partition_key("region").build())
    text = repr(schema)
    assert "tags string string_agg(delimiter=';', distinct=True)" in text
    assert "revenue int64 sum," in text
    assert "primary key ['product', 'region'], partition key ['region']" in text
    assert "NOT NULL" not in text  # key columns are never null: not repeated
    descriptor = tally.TableDescriptor(schema, bucket_count=2,
                                       properties={"table.merge-engine": "aggregation"})
    assert "distinct=True" in repr(descriptor)


def test_lock_reprs_show_iso_times_and_hide_the_secret():
    lease = Lease("db.t", 7, "job-1", ("a", "b"), token=5, expires_at=MOMENT, ttl=60.0,
                  initial_offsets={}, tenure=5, secret="s3cret")
    text = repr(lease)
    assert "expires 2026-11-24T04:47:03.120Z" in text and "ttl 60s" in text
    assert "s3cret" not in text and str(MOMENT) not in text
    record = LockRecord("job-1", 7, (1, 2), ("a", "b"), 30.5, MOMENT, 5, {}, MOMENT - 60,
                        secret_hash="h4sh")
    text = repr(record)
    assert "created 2026-11-24T04:46:03.120Z" in text
    assert "expires 2026-11-24T04:47:03.120Z" in text and "ttl 30.50s" in text
    assert "h4sh" not in text
    held = HeldLock("job-1", frozenset({1}), ("a",), 5, MOMENT)
    assert "expires 2026-11-24T04:47:03.120Z" in repr(held)


def test_sink_options_repr_hides_the_token():
    from sink.options import SinkOptions

    options = SinkOptions.parse({"url": "grpc://h:1", "table": "db.t", "token": "t0ken"})
    assert "t0ken" not in repr(options) and "db.t" in repr(options)


def test_table_info_and_results_show_readable_times():
    schema = tally.Schema.builder().column("k", pa.int64()).column("v", pa.int64()) \
        .primary_key("k").build()
    info = TableInfo("db.t", 3, tally.TableDescriptor(schema), [], MOMENT)
    assert "created 2026-11-24T04:47:03.120Z" in repr(info)
    result = EpochResult(4, False, rows=10, keys=3, seconds=1.23456789)
    assert "1.23s" in repr(result) and "1.2345" not in repr(result)
    report = RecoveryReport("db.t", "job-1", "its last commit", seconds=0.123456)
    assert "0.123s" in repr(report)
    undo = UndoResult(baseline=3, end=9, seconds=2.0, bucket=1)
    assert "offsets [3, 9)" in repr(undo) and "2s" in repr(undo)
