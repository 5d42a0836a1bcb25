"""Bad input fails before any write, with a message naming the problem; a null key fails its
whole batch and nothing of that batch is applied."""

from __future__ import annotations

import pytest

from sink import TallySink
from tests.spark import sink_data


@pytest.mark.parametrize("ddl, message", [
    ("v long, s string", "lacks the primary-key column(s) ['k']"),
    ("k long, v string", "DataFrame column 'v' has type string, which cannot feed column 'v'"),
    ("k long, v long, color string", "DataFrame column 'color' is not a column of table"),
])
def test_bad_dataframes_fail_before_any_write(spark, cluster, conn, table_name, ddl, message):
    sink_data.create_table(conn, table_name)
    rows = [tuple(1 if t.endswith("long") else "x" for t in ddl.split(", "))]
    df = spark.createDataFrame(rows, ddl)
    with pytest.raises(Exception) as raised:
        TallySink(cluster.url, table_name).write(df)
    assert message in str(raised.value)
    assert conn.table(table_name).to_arrow().num_rows == 0
    assert conn.locks.describe(table_name) == []   # refused before the lock was taken


def test_null_key_fails_the_batch_and_applies_nothing(spark, cluster, conn, table_name,
                                                     tmp_path):
    sink_data.create_table(conn, table_name)
    # Spark's file sources make every column nullable, the key included: that is accepted...
    good = sink_data.write_source_files(str(tmp_path / "src"), 1, 20, 5, seed=1)
    frame = (spark.readStream.schema(sink_data.SCHEMA_DDL).json(str(tmp_path / "src")))
    assert frame.schema["k"].nullable
    sink = TallySink(cluster.url, table_name)
    query = sink.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    before = conn.table(table_name).to_arrow()
    assert sink_data.table_state(conn, table_name) == sink_data.expected(good[0])
    # ...but a row whose key is null fails its batch, and nothing of that batch is applied
    with open(tmp_path / "src" / "part-9999.json", "w") as f:
        f.write('{"k": 1, "v": 1000}\n{"k": null, "v": 5}\n{"k": 2, "v": 7}\n')
    query = sink.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    with pytest.raises(Exception) as raised:
        query.awaitTermination()
    assert "primary-key column 'k' is null" in str(raised.value)
    assert "nothing of it was written" in str(raised.value)
    assert conn.table(table_name).to_arrow().equals(before)
